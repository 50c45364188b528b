package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Usage is the help text of `hvdd run`.
const Usage = `Usage: hvdd run -np N [flags] [--] COMMAND [ARGS...]

Start N copies of COMMAND on this node as one hvdd job, like horovodrun or
mpirun. If no hvdd daemon is listening on the socket, one is started for the
job and stopped when the job ends; a daemon that was already running is left
alone.

Each rank gets its place in the job through the environment:
  HVDD_RANK, HVDD_SIZE, HVDD_LOCAL_RANK, HVDD_LOCAL_SIZE, HVDD_SOCKET
  HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
  HOROVOD_CROSS_RANK (0), HOROVOD_CROSS_SIZE (1)

Every line a rank writes is tagged with its rank, as mpirun --tag-output does:
  [1]<stdout>:epoch 3 loss 0.25
  [0]<stderr>:warning: ...

If a rank exits with a non-zero status or dies from a signal, the other ranks
get SIGTERM, then SIGKILL after the kill grace, and hvdd run exits with the
failed rank's status (128+N for death by signal N). SIGINT, SIGTERM and SIGHUP
sent to hvdd run are forwarded to every rank; a second Ctrl-C kills them at
once.

Flags (they stop at "--" or at the first argument that is not a flag):
  -np N, --num-proc N
        number of processes to start (required, at least 1)
  --socket PATH
        daemon socket (default: $HVDD_SOCKET, else /run/hvdd/hvdd.sock for
        root, else $XDG_RUNTIME_DIR/hvdd.sock, else $TMPDIR/hvdd-UID/hvdd.sock)
  --no-tag-output
        do not prefix output lines with the rank; ranks write straight to
        hvdd run's stdout and stderr
  --start-timeout DURATION
        how long to wait for a newly started daemon to accept connections
        (default 30s)
  --kill-grace DURATION
        time between SIGTERM and SIGKILL when stopping ranks (default 5s)
  -x NAME[=VALUE]
        export NAME to every rank, with VALUE or with its value in hvdd run's
        environment (ignored if unset there); may be repeated
  -h, --help
        show this help

Examples:
  hvdd run -np 4 python train.py --epochs 10
  hvdd run -np 2 --socket /tmp/hvdd.sock -- python -u train.py
  hvdd run -np 8 -x NCCL_DEBUG=INFO -x CUDA_VISIBLE_DEVICES -- ./train
  hvdd run -np 2 --no-tag-output --kill-grace 30s -- python train.py
`

// envList is the flag.Value behind -x.
type envList struct {
	env *[]string
}

func (e envList) String() string {
	if e.env == nil {
		return ""
	}
	return strings.Join(*e.env, ",")
}

func (e envList) Set(s string) error {
	name, value, hasValue := strings.Cut(s, "=")
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return fmt.Errorf("%q is not NAME or NAME=VALUE", s)
	}
	if !hasValue {
		v, ok := os.LookupEnv(name)
		if !ok {
			return nil // mpirun -x semantics: nothing to export
		}
		value = v
	}
	*e.env = append(*e.env, name+"="+value)
	return nil
}

// ParseArgs parses the arguments of `hvdd run` (without "run" itself) into a
// Config. Flags end at "--" or at the first argument that is not a flag; the
// rest is the command. Both -flag and --flag spellings are accepted. Socket
// is resolved with SocketPath, so the returned Config names the socket Run
// will use (cmd/hvdd needs it to build DaemonCommand). Durations not given
// are left zero, meaning Run's defaults.
//
// For -h or --help, ParseArgs returns an error wrapping flag.ErrHelp; the
// caller should print Usage and exit 0.
func ParseArgs(args []string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("hvdd run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&c.NP, "np", 0, "")
	fs.IntVar(&c.NP, "num-proc", 0, "")
	fs.StringVar(&c.Socket, "socket", "", "")
	fs.BoolVar(&c.NoTagOutput, "no-tag-output", false, "")
	fs.DurationVar(&c.StartTimeout, "start-timeout", 0, "")
	fs.DurationVar(&c.KillGrace, "kill-grace", 0, "")
	fs.Var(envList{&c.Env}, "x", "")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, fmt.Errorf("hvdd run: %w", err)
		}
		return Config{}, fmt.Errorf("%v; see 'hvdd run --help'", err)
	}
	c.Command = fs.Args()
	switch {
	case !flagSet(fs, "np") && !flagSet(fs, "num-proc"):
		return Config{}, errors.New("-np is required: pass the number of processes, e.g. hvdd run -np 4 -- python train.py")
	case c.StartTimeout < 0 || c.KillGrace < 0:
		return Config{}, errors.New("--start-timeout and --kill-grace must not be negative; pass e.g. 30s")
	}
	if c.StartTimeout == 0 && flagSet(fs, "start-timeout") {
		return Config{}, errors.New("--start-timeout must be positive; pass e.g. 30s")
	}
	if c.KillGrace == 0 && flagSet(fs, "kill-grace") {
		return Config{}, errors.New("--kill-grace must be positive; pass e.g. 5s (SIGKILL at once is not supported)")
	}
	c.Socket = SocketPath(c.Socket)
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
