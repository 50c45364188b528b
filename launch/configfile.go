package launch

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// horovodrun's --config-file: a YAML file of runtime parameters
// (horovod/runner/common/util/config_parser.py set_args_from_config):
//
//	controller: gloo | mpi
//	params: {fusion_threshold_mb, cycle_time_ms, cache_capacity,
//	         hierarchical_allreduce, hierarchical_allgather}
//	autotune: {enabled, log_file, warmup_samples, steps_per_sample,
//	           bayes_opt_max_samples, gaussian_process_noise}
//	timeline: {filename, mark_cycles}
//	stall_check: {enabled, warning_time_seconds, shutdown_time_seconds}
//	library_options: {mpi_threads_disable, num_nccl_streams,
//	                  ccl_bgt_affinity, gloo_timeout_seconds}
//	logging: {level, with_timestamp}
//
// As in horovodrun, a value applies only where its flag was not given on
// the command line (wherever the flag stands), and a section present
// without autotune.enabled turns autotuning off, without
// stall_check.enabled leaves the stall check on. The keys of knobs fill
// Knobs; controller and library_options mean nothing to hvdd (see
// refusedFlags) and only bring a warning, as do keys horovodrun does not
// know (which it ignores silently).

// configFile is the file's schema; a nil field is absent.
type configFile struct {
	Controller *string `yaml:"controller"`
	Params     *struct {
		FusionThresholdMB     *int64   `yaml:"fusion_threshold_mb"`
		CycleTimeMS           *float64 `yaml:"cycle_time_ms"`
		CacheCapacity         *int64   `yaml:"cache_capacity"`
		HierarchicalAllreduce *bool    `yaml:"hierarchical_allreduce"`
		HierarchicalAllgather *bool    `yaml:"hierarchical_allgather"`
	} `yaml:"params"`
	Autotune *struct {
		Enabled              *bool    `yaml:"enabled"`
		LogFile              *string  `yaml:"log_file"`
		WarmupSamples        *int64   `yaml:"warmup_samples"`
		StepsPerSample       *int64   `yaml:"steps_per_sample"`
		BayesOptMaxSamples   *int64   `yaml:"bayes_opt_max_samples"`
		GaussianProcessNoise *float64 `yaml:"gaussian_process_noise"`
	} `yaml:"autotune"`
	Timeline *struct {
		Filename   *string `yaml:"filename"`
		MarkCycles *bool   `yaml:"mark_cycles"`
	} `yaml:"timeline"`
	StallCheck *struct {
		Enabled             *bool  `yaml:"enabled"`
		WarningTimeSeconds  *int64 `yaml:"warning_time_seconds"`
		ShutdownTimeSeconds *int64 `yaml:"shutdown_time_seconds"`
	} `yaml:"stall_check"`
	LibraryOptions map[string]yaml.Node `yaml:"library_options"`
	Logging        *struct {
		Level         *string `yaml:"level"`
		WithTimestamp *bool   `yaml:"with_timestamp"`
	} `yaml:"logging"`
}

// configKeys are the keys horovodrun reads, by section ("" for the top
// level).
var configKeys = map[string][]string{
	"":                {"controller", "params", "autotune", "timeline", "stall_check", "library_options", "logging"},
	"params":          {"fusion_threshold_mb", "cycle_time_ms", "cache_capacity", "hierarchical_allreduce", "hierarchical_allgather"},
	"autotune":        {"enabled", "log_file", "warmup_samples", "steps_per_sample", "bayes_opt_max_samples", "gaussian_process_noise"},
	"timeline":        {"filename", "mark_cycles"},
	"stall_check":     {"enabled", "warning_time_seconds", "shutdown_time_seconds"},
	"library_options": {"mpi_threads_disable", "num_nccl_streams", "ccl_bgt_affinity", "gloo_timeout_seconds"},
	"logging":         {"level", "with_timestamp"},
}

// libraryOptionWhy says why each library option means nothing here.
var libraryOptionWhy = map[string]string{
	"mpi_threads_disable":  "hvdd's ranks never initialise MPI",
	"num_nccl_streams":     "hvdd does not use NCCL",
	"ccl_bgt_affinity":     "hvdd's ranks have no Horovod background thread to pin",
	"gloo_timeout_seconds": "there is no Gloo in hvdd",
}

// applyConfigFile reads horovodrun's YAML config file name and fills the
// fields of k that are still nil. It returns warnings for what it leaves
// out, and an error naming the file (and line) for a file it cannot use.
func applyConfigFile(name string, k *Knobs) (warnings []string, err error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--config-file: %w", err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("--config-file %s: %w", name, err)
	}
	if len(root.Content) == 0 {
		return nil, nil // empty file
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("--config-file %s: line %d: want a mapping of sections (params:, autotune:, timeline:, ...)", name, doc.Line)
	}
	warnings = unknownKeys(name, "", doc)
	var cf configFile
	if err := doc.Decode(&cf); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("--config-file %s: %s", name, strings.Join(te.Errors, "; "))
		}
		return nil, fmt.Errorf("--config-file %s: %w", name, err)
	}

	if c := cf.Controller; c != nil {
		switch strings.ToLower(*c) {
		case "gloo", "mpi":
			warnings = append(warnings, fmt.Sprintf("--config-file %s: controller: %s is ignored: hvdd's daemons are the controller (for MPI between the hosts' daemons pass --backend mpi)", name, *c))
		default:
			return nil, fmt.Errorf("--config-file %s: No such controller supported: %s (horovodrun takes gloo or mpi)", name, *c)
		}
	}
	if p := cf.Params; p != nil {
		fill(&k.FusionThresholdMB, p.FusionThresholdMB)
		fill(&k.CycleTimeMS, p.CycleTimeMS)
		fill(&k.CacheCapacity, p.CacheCapacity)
		fill(&k.HierarchicalAllreduce, p.HierarchicalAllreduce)
		fill(&k.HierarchicalAllgather, p.HierarchicalAllgather)
	}
	if a := cf.Autotune; a != nil {
		off := false
		fill(&k.Autotune, a.Enabled)
		fill(&k.Autotune, &off) // a section without enabled: off, as horovodrun
		fill(&k.AutotuneLogFile, a.LogFile)
		fill(&k.AutotuneWarmupSamples, a.WarmupSamples)
		fill(&k.AutotuneStepsPerSample, a.StepsPerSample)
		fill(&k.AutotuneBayesOptMaxSamples, a.BayesOptMaxSamples)
		fill(&k.AutotuneGaussianProcessNoise, a.GaussianProcessNoise)
	}
	if t := cf.Timeline; t != nil {
		fill(&k.TimelineFilename, t.Filename)
		fill(&k.TimelineMarkCycles, t.MarkCycles)
	}
	if s := cf.StallCheck; s != nil && k.NoStallCheck == nil {
		off := s.Enabled != nil && !*s.Enabled
		k.NoStallCheck = &off
	}
	if s := cf.StallCheck; s != nil {
		fill(&k.StallCheckWarningSeconds, s.WarningTimeSeconds)
		fill(&k.StallCheckShutdownSeconds, s.ShutdownTimeSeconds)
	}
	for _, key := range sortedKeys(cf.LibraryOptions) {
		if why, ok := libraryOptionWhy[key]; ok {
			warnings = append(warnings, fmt.Sprintf("--config-file %s: library_options.%s is ignored: %s", name, key, why))
		}
	}
	if l := cf.Logging; l != nil {
		fill(&k.LogLevel, l.Level)
		fill(&k.LogWithTimestamp, l.WithTimestamp)
	}
	return warnings, nil
}

// fill sets *dst to src where *dst is nil: the command line wins.
func fill[T any](dst **T, src *T) {
	if *dst == nil && src != nil {
		v := *src
		*dst = &v
	}
}

// unknownKeys warns about the keys of mapping m (section sec) that
// horovodrun does not read, and recurses into the known sections.
func unknownKeys(file, sec string, m *yaml.Node) []string {
	var warnings []string
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, val := m.Content[i], m.Content[i+1]
		path := key.Value
		if sec != "" {
			path = sec + "." + key.Value
		}
		if !slices.Contains(configKeys[sec], key.Value) {
			warnings = append(warnings, fmt.Sprintf("--config-file %s: line %d: unknown key %s is ignored (horovodrun ignores it too; check its spelling)", file, key.Line, path))
			continue
		}
		if _, isSection := configKeys[key.Value]; sec == "" && isSection && val.Kind == yaml.MappingNode {
			warnings = append(warnings, unknownKeys(file, key.Value, val)...)
		}
	}
	return warnings
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
