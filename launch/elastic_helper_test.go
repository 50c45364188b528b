package launch

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The daemon side of the elastic driver (hvdd serve --elastic) lands on
// its own. Until the hvdd built for the tests has --elastic, the jobs the
// driver runs start their daemons through a shim that drops the flag, so
// that the tests whose ranks need not join a running job run against
// today's daemons; the others skip (see requireElasticDaemon).
var (
	elasticOnce   sync.Once
	elasticBin    string
	elasticNative bool
	elasticErr    error
)

// elasticHvdd returns the hvdd for jobs the elastic driver runs, and
// whether it is the real one (it has --elastic) rather than the shim.
func elasticHvdd(t *testing.T) (string, bool) {
	t.Helper()
	bin := buildHvdd(t)
	elasticOnce.Do(func() {
		if exec.Command(bin, "serve", "--elastic", "--help").Run() == nil {
			elasticBin, elasticNative = bin, true
			return
		}
		elasticBin = filepath.Join(hvddBinDir, "hvdd-without-elastic")
		shim := "#!/bin/sh\n# hvdd without serve's --elastic, which this build lacks\n" +
			"for a do\n\tshift\n\t[ \"$a\" = --elastic ] || set -- \"$@\" \"$a\"\ndone\nexec " + shellQuote(bin) + " \"$@\"\n"
		elasticErr = os.WriteFile(elasticBin, []byte(shim), 0o755)
	})
	if elasticErr != nil {
		t.Fatal(elasticErr)
	}
	return elasticBin, elasticNative
}

// requireElasticDaemon skips a test whose ranks join a running elastic job
// unless hvdd serve has --elastic.
func requireElasticDaemon(t *testing.T) string {
	t.Helper()
	bin, native := elasticHvdd(t)
	if !native {
		t.Skip("hvdd serve has no --elastic yet: the daemons cannot take in ranks that join a running job")
	}
	return bin
}
