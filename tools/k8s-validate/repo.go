package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// Repo holds the facts of the worker that the manifests must agree with, read
// from the repository's sources (not restated here, so a change in the worker
// that the manifests do not follow fails the check).
type Repo struct {
	// Paths the HTTP server answers (src/telemetry/http.rs).
	Routes map[string]bool
	// Environment variables the binary reads (its settings, declared in
	// src/config/catalog.rs, clap `env = "…"` and env::var).
	EnvVars map[string]bool
	// Declared defaults (src/config/catalog.rs) and STOP_MARGIN (src/config.rs).
	ShutdownGrace, KafkaRequestTimeout, StopMargin time.Duration
	// How long /readyz waits for the database (src/db/pool.rs).
	DBPingTimeout time.Duration
	// deploy/prometheus/alerts.yml as prometheus-operator types.
	Alerts monitoringv1.PrometheusRuleSpec
	// Largest peak RSS (VmHWM) of `run` in the bench (docs/bench/results.json).
	PeakRSSBytes int64
	// The job label the alerts select (deploy/prometheus/alerts.yml).
	AlertJob string
	// Subcommands of the binary (src/config/cli.rs, enum Command).
	Subcommands map[string]bool
}

var (
	routeRe   = regexp.MustCompile(`"(/[A-Za-z0-9_./-]*)"\s*=>`)
	clapEnvRe = regexp.MustCompile(`env\s*=\s*"([A-Z][A-Z0-9_]*)"`)
	envVarRe  = regexp.MustCompile(`env::var(?:_os)?\("([A-Z][A-Z0-9_]*)"\)`)
	// The standard OpenTelemetry variables src/telemetry/trace.rs names (read
	// through a lookup function, or by the SDK itself).
	otelVarRe  = regexp.MustCompile(`"(OTEL_[A-Z0-9_]+)"`)
	jobRe      = regexp.MustCompile(`job="([^"]+)"`)
	commandRe  = regexp.MustCompile(`(?s)pub enum Command \{(.*?)\n\}`)
	variantRe  = regexp.MustCompile(`(?m)^    ([A-Z][A-Za-z]*)\s*[({,]`)
	stopBodyRe = regexp.MustCompile(`(?s)pub fn stop_grace\(&self\) -> Duration \{(.*?)\n    \}`)
	// A setting's declaration in src/config/catalog.rs, to the end of its
	// help text: `    NAME: Type = default => values, "help";`.
	declarationRe = regexp.MustCompile(`(?ms)^    ([A-Z][A-Z0-9_]*): (.*?)";$`)
	// A declared duration default: `= secs(10) =>`.
	declaredDurationRe = regexp.MustCompile(`^[^=]*= (ms|secs|minutes|hours|days)\((\d+)\)\s*=>`)
)

// declarations reads the settings of src/config/catalog.rs: each name and
// the rest of its declaration.
func declarations(source string) map[string]string {
	found := map[string]string{}
	for _, m := range declarationRe.FindAllStringSubmatch(source, -1) {
		found[m[1]] = m[2]
	}
	return found
}

// declaredDuration is the default of a setting declared `NAME: Duration = secs(N) => …`.
func declaredDuration(decls map[string]string, name string) (time.Duration, error) {
	m := declaredDurationRe.FindStringSubmatch(decls[name])
	if m == nil {
		return 0, fmt.Errorf("setting %s (Duration = ms/secs/minutes/hours/days(N)) not found", name)
	}
	n, err := strconv.ParseInt(m[2], 10, 64)
	if err != nil {
		return 0, err
	}
	unit := map[string]time.Duration{
		"ms": time.Millisecond, "secs": time.Second, "minutes": time.Minute,
		"hours": time.Hour, "days": 24 * time.Hour,
	}[m[1]]
	return time.Duration(n) * unit, nil
}

// durationConst finds `pub const NAME: Duration = Duration::from_secs(N);` (or from_millis).
func durationConst(source, name string) (time.Duration, error) {
	re := regexp.MustCompile(`(?:pub(?:\([a-z]+\))? )?const ` + name + `: Duration\s*=\s*Duration::from_(secs|millis)\((\d+)\)`)
	m := re.FindStringSubmatch(source)
	if m == nil {
		return 0, fmt.Errorf("constant %s (Duration::from_secs/from_millis) not found", name)
	}
	n, err := strconv.ParseInt(m[2], 10, 64)
	if err != nil {
		return 0, err
	}
	if m[1] == "secs" {
		return time.Duration(n) * time.Second, nil
	}
	return time.Duration(n) * time.Millisecond, nil
}

func readText(root, rel string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return "", fmt.Errorf("reading the worker's sources: %w", err)
	}
	return string(data), nil
}

// LoadRepo reads the facts from a checkout of the repository.
func LoadRepo(root string) (*Repo, error) {
	repo := &Repo{Routes: map[string]bool{}, EnvVars: map[string]bool{}, Subcommands: map[string]bool{}}

	httpSrc, err := readText(root, "src/telemetry/http.rs")
	if err != nil {
		return nil, err
	}
	for _, m := range routeRe.FindAllStringSubmatch(httpSrc, -1) {
		repo.Routes[m[1]] = true
	}
	if len(repo.Routes) == 0 {
		return nil, fmt.Errorf("src/telemetry/http.rs: no route (\"/path\" =>) found")
	}

	poolSrc, err := readText(root, "src/db/pool.rs")
	if err != nil {
		return nil, err
	}
	if repo.DBPingTimeout, err = durationConst(poolSrc, "DB_PING_TIMEOUT"); err != nil {
		return nil, fmt.Errorf("src/db/pool.rs: %w", err)
	}

	err = filepath.WalkDir(filepath.Join(root, "src"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rs") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, re := range []*regexp.Regexp{clapEnvRe, envVarRe, otelVarRe} {
			for _, m := range re.FindAllStringSubmatch(string(data), -1) {
				repo.EnvVars[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading src/: %w", err)
	}
	// Read by tracing-subscriber's EnvFilter::try_from_default_env, not by name in src/.
	repo.EnvVars["RUST_LOG"] = true

	catalog, err := readText(root, "src/config/catalog.rs")
	if err != nil {
		return nil, err
	}
	decls := declarations(catalog)
	for name, rest := range decls {
		// A flag without a variable (`seed --spread`) is no variable.
		if !strings.Contains(rest, ".flag(\"") {
			repo.EnvVars[name] = true
		}
	}
	if repo.ShutdownGrace, err = declaredDuration(decls, "SHUTDOWN_GRACE"); err != nil {
		return nil, fmt.Errorf("src/config/catalog.rs: %w", err)
	}
	if repo.KafkaRequestTimeout, err = declaredDuration(decls, "KAFKA_REQUEST_TIMEOUT"); err != nil {
		return nil, fmt.Errorf("src/config/catalog.rs: %w", err)
	}
	config, err := readText(root, "src/config.rs")
	if err != nil {
		return nil, err
	}
	if repo.StopMargin, err = durationConst(config, "STOP_MARGIN"); err != nil {
		return nil, fmt.Errorf("src/config.rs: %w", err)
	}
	// The grace check below adds exactly these two terms (no Kafka timeout:
	// no database transaction waits on Kafka); if the formula changes, this
	// check must change with it.
	body := stopBodyRe.FindStringSubmatch(config)
	if body == nil {
		return nil, fmt.Errorf("src/config.rs: fn stop_grace not found")
	}
	for _, term := range []string{"self.shutdown.grace", "STOP_MARGIN"} {
		if !strings.Contains(body[1], term) {
			return nil, fmt.Errorf("src/config.rs: stop_grace no longer adds %s; update tools/k8s-validate", term)
		}
	}
	if strings.Count(body[1], "+") != 1 {
		return nil, fmt.Errorf("src/config.rs: stop_grace is no longer the sum of two terms; update tools/k8s-validate")
	}

	cli, err := readText(root, "src/config/cli.rs")
	if err != nil {
		return nil, err
	}
	enum := commandRe.FindStringSubmatch(cli)
	if enum == nil {
		return nil, fmt.Errorf("src/config/cli.rs: enum Command not found")
	}
	for _, m := range variantRe.FindAllStringSubmatch(enum[1], -1) {
		repo.Subcommands[strings.ToLower(m[1])] = true
	}

	results, err := os.ReadFile(filepath.Join(root, "docs/bench/results.json"))
	if err != nil {
		return nil, fmt.Errorf("the measured RSS: %w", err)
	}
	var bench struct {
		EndToEnd struct {
			Runs []struct {
				PeakRSSKiB int64 `json:"peak_rss_kib"`
			} `json:"runs"`
		} `json:"end_to_end"`
	}
	if err := json.Unmarshal(results, &bench); err != nil {
		return nil, fmt.Errorf("docs/bench/results.json: %w", err)
	}
	for _, run := range bench.EndToEnd.Runs {
		repo.PeakRSSBytes = max(repo.PeakRSSBytes, run.PeakRSSKiB*1024)
	}
	if repo.PeakRSSBytes == 0 {
		return nil, fmt.Errorf("docs/bench/results.json: no end_to_end.runs[].peak_rss_kib")
	}

	alerts, err := readText(root, "deploy/prometheus/alerts.yml")
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict([]byte(alerts), &repo.Alerts); err != nil {
		return nil, fmt.Errorf("deploy/prometheus/alerts.yml as a PrometheusRule spec: %w", err)
	}
	jobs := map[string]bool{}
	for _, m := range jobRe.FindAllStringSubmatch(alerts, -1) {
		jobs[m[1]] = true
	}
	if len(jobs) != 1 {
		names := make([]string, 0, len(jobs))
		for job := range jobs {
			names = append(names, job)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("deploy/prometheus/alerts.yml: expected one job=\"…\" selector, found %v", names)
	}
	for job := range jobs {
		repo.AlertJob = job
	}
	return repo, nil
}

// StopGrace is Settings::stop_grace for the given settings.
func (r *Repo) StopGrace(shutdownGrace time.Duration) time.Duration {
	return shutdownGrace + r.StopMargin
}

var humanUnits = map[string]time.Duration{
	"ns": time.Nanosecond, "nsec": time.Nanosecond,
	"us": time.Microsecond, "usec": time.Microsecond, "µs": time.Microsecond,
	"ms": time.Millisecond, "msec": time.Millisecond, "millis": time.Millisecond,
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hrs": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

var humanTokenRe = regexp.MustCompile(`^\s*(\d+)\s*([a-zµ]+)`)

// parseHumanDuration parses the humantime forms the worker accepts for
// durations ("10s", "500ms", "1m 30s", "2min").
func parseHumanDuration(text string) (time.Duration, error) {
	rest := strings.TrimSpace(text)
	if rest == "" {
		return 0, fmt.Errorf("empty duration")
	}
	var total time.Duration
	for rest != "" {
		m := humanTokenRe.FindStringSubmatch(rest)
		if m == nil {
			return 0, fmt.Errorf("cannot read duration %q", text)
		}
		unit, ok := humanUnits[m[2]]
		if !ok {
			return 0, fmt.Errorf("unknown unit %q in duration %q", m[2], text)
		}
		n, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			return 0, err
		}
		total += time.Duration(n) * unit
		rest = strings.TrimSpace(rest[len(m[0]):])
	}
	return total, nil
}
