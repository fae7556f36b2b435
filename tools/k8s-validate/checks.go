package main

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Names the manifests and the worker share.
const (
	workerContainer  = "worker"
	migrateContainer = "migrate"
	// Where a session goes past a transaction pooler (LISTEN, migrate).
	directURLKey  = "DATABASE_DIRECT_URL"
	livenessPath  = "/healthz"
	readinessPath = "/readyz"
	metricsPath   = "/metrics"
	// Memory request and limit, as multiples of the measured peak RSS.
	requestOverPeak = 2
	limitOverPeak   = 4
)

// manifests groups the decoded objects of one rendered file by kind.
type manifests struct {
	deployments     []*appsv1.Deployment
	jobs            []*batchv1.Job
	services        []*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	serviceAccounts map[string]*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
}

// problems collects failures with the object they are about.
type problems []error

func (p *problems) add(where string, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
}

func group(objects []object, p *problems) manifests {
	m := manifests{
		configMaps:      map[string]*corev1.ConfigMap{},
		secrets:         map[string]*corev1.Secret{},
		serviceAccounts: map[string]*corev1.ServiceAccount{},
	}
	for _, o := range objects {
		switch obj := o.obj.(type) {
		case *appsv1.Deployment:
			m.deployments = append(m.deployments, obj)
		case *batchv1.Job:
			m.jobs = append(m.jobs, obj)
		case *corev1.Service:
			m.services = append(m.services, obj)
		case *corev1.ConfigMap:
			m.configMaps[obj.Name] = obj
		case *corev1.Secret:
			m.secrets[obj.Name] = obj
		case *corev1.ServiceAccount:
			m.serviceAccounts[obj.Name] = obj
		case *policyv1.PodDisruptionBudget:
			m.pdbs = append(m.pdbs, obj)
		case *monitoringv1.ServiceMonitor:
			m.serviceMonitors = append(m.serviceMonitors, obj)
		case *monitoringv1.PrometheusRule:
			m.rules = append(m.rules, obj)
		default:
			p.add(o.String(), "kind %s is decoded but has no checks; add them to tools/k8s-validate", o.kind)
		}
		checkMeta(o, p)
	}
	return m
}

// checkMeta applies the API server's name and label rules.
func checkMeta(o object, p *problems) {
	meta, ok := o.obj.(metav1.Object)
	if !ok {
		return
	}
	for _, msg := range validation.IsDNS1123Subdomain(meta.GetName()) {
		p.add(o.String(), "metadata.name: %s", msg)
	}
	for key, value := range meta.GetLabels() {
		for _, msg := range validation.IsQualifiedName(key) {
			p.add(o.String(), "label key %q: %s", key, msg)
		}
		for _, msg := range validation.IsValidLabelValue(value) {
			p.add(o.String(), "label %s=%q: %s", key, value, msg)
		}
	}
}

func semanticChecks(objects []object, repo *Repo) []error {
	var p problems
	m := group(objects, &p)
	for kind, count := range map[string]int{
		"Deployment": len(m.deployments), "Service": len(m.services), "PodDisruptionBudget": len(m.pdbs),
		"ServiceMonitor": len(m.serviceMonitors), "PrometheusRule": len(m.rules), "ConfigMap": len(m.configMaps),
	} {
		if count == 0 {
			p.add("rendered manifests", "no %s", kind)
		}
	}
	if len(m.deployments) != 1 {
		p.add("rendered manifests", "expected exactly one Deployment (the worker), found %d", len(m.deployments))
		return p
	}
	deploy := m.deployments[0]
	where := "Deployment/" + deploy.Name
	pod := &deploy.Spec.Template
	podLabels := labels.Set(pod.Labels)

	checkSelector(where, deploy.Spec.Selector, podLabels, &p)
	if deploy.Spec.Replicas != nil && *deploy.Spec.Replicas < 2 {
		p.add(where, "replicas %d: run at least 2 so a drain or a crash leaves one running", *deploy.Spec.Replicas)
	}
	if sa := pod.Spec.ServiceAccountName; sa != "" {
		if account, ok := m.serviceAccounts[sa]; !ok {
			p.add(where, "serviceAccountName %q: no such ServiceAccount rendered", sa)
		} else if account.AutomountServiceAccountToken == nil || *account.AutomountServiceAccountToken {
			p.add("ServiceAccount/"+sa, "automountServiceAccountToken must be false: the worker never calls the Kubernetes API")
		}
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		p.add(where, "spec.template.spec.automountServiceAccountToken must be false")
	}
	checkPodSecurity(where, &pod.Spec, &p)

	worker := findContainer(pod.Spec.Containers, workerContainer)
	if worker == nil {
		p.add(where, "no container named %q", workerContainer)
		return p
	}
	checkWorker(where, &pod.Spec, worker, &m, repo, &p)
	checkMigrate(where, deploy, worker, &m, repo, &p)
	for i := range pod.Spec.Containers {
		checkContainer(where, &pod.Spec, &pod.Spec.Containers[i], worker.Image, &m, repo, &p)
	}
	for i := range pod.Spec.InitContainers {
		checkContainer(where, &pod.Spec, &pod.Spec.InitContainers[i], worker.Image, &m, repo, &p)
	}
	checkVolumes(where, &pod.Spec, &p)

	service := checkServices(&m, podLabels, worker, &p)
	checkPDBs(&m, deploy, podLabels, &p)
	checkServiceMonitors(&m, service, repo, &p)
	checkRules(&m, repo, &p)
	for _, job := range m.jobs {
		jw := "Job/" + job.Name
		checkPodSecurity(jw, &job.Spec.Template.Spec, &p)
		for i := range job.Spec.Template.Spec.Containers {
			checkContainer(jw, &job.Spec.Template.Spec, &job.Spec.Template.Spec.Containers[i], worker.Image, &m, repo, &p)
		}
	}
	return p
}

func findContainer(containers []corev1.Container, name string) *corev1.Container {
	for i := range containers {
		if containers[i].Name == name {
			return &containers[i]
		}
	}
	return nil
}

func checkSelector(where string, selector *metav1.LabelSelector, podLabels labels.Set, p *problems) {
	if selector == nil || (len(selector.MatchLabels) == 0 && len(selector.MatchExpressions) == 0) {
		p.add(where, "empty selector")
		return
	}
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		p.add(where, "selector: %v", err)
		return
	}
	if !sel.Matches(podLabels) {
		p.add(where, "selector %s does not match the worker's pod labels %v", sel, podLabels)
	}
}

func checkPodSecurity(where string, spec *corev1.PodSpec, p *problems) {
	sc := spec.SecurityContext
	if sc == nil {
		p.add(where, "no pod securityContext")
		return
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		p.add(where, "securityContext.runAsNonRoot must be true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		p.add(where, "securityContext.runAsUser must be set to a non-zero uid (the image's 65532)")
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add(where, "securityContext.seccompProfile.type must be RuntimeDefault")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		p.add(where, "host namespaces are not needed")
	}
}

// env is what a container sees: envFrom sources, then explicit env on top.
type env struct {
	values map[string]string // literal values (ConfigMap data, Secret data, value:)
	known  map[string]bool   // every name set, including valueFrom ones we cannot resolve
}

func containerEnv(where string, c *corev1.Container, m *manifests, repo *Repo, p *problems) env {
	e := env{values: map[string]string{}, known: map[string]bool{}}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, ok := m.configMaps[from.ConfigMapRef.Name]
			if !ok {
				p.add(where, "envFrom ConfigMap %q is not rendered", from.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				if !repo.EnvVars[k] {
					p.add("ConfigMap/"+cm.Name, "key %q is not an environment variable the worker reads", k)
				}
				e.values[from.Prefix+k] = v
				e.known[from.Prefix+k] = true
			}
		case from.SecretRef != nil:
			secret, ok := m.secrets[from.SecretRef.Name]
			if !ok {
				continue // provided by the operator: checked where rendered (the example overlay)
			}
			for k, v := range secretData(secret) {
				if !repo.EnvVars[k] {
					p.add("Secret/"+secret.Name, "key %q is not an environment variable the worker reads", k)
				}
				e.values[from.Prefix+k] = v
				e.known[from.Prefix+k] = true
			}
		}
	}
	for _, v := range c.Env {
		if !repo.EnvVars[v.Name] {
			p.add(where, "container %s: env %q is not an environment variable the worker reads", c.Name, v.Name)
		}
		delete(e.values, v.Name)
		e.known[v.Name] = true
		switch {
		case v.ValueFrom == nil:
			e.values[v.Name] = v.Value
		case v.ValueFrom.SecretKeyRef != nil:
			ref := v.ValueFrom.SecretKeyRef
			if secret, ok := m.secrets[ref.Name]; ok {
				value, found := secretData(secret)[ref.Key]
				if !found {
					p.add(where, "container %s: env %s: Secret %q has no key %q", c.Name, v.Name, ref.Name, ref.Key)
				}
				e.values[v.Name] = value
			}
		}
	}
	return e
}

func secretData(s *corev1.Secret) map[string]string {
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

// durationSetting reads a duration setting from the container's env, or
// takes the worker's default when the env does not set it.
func durationSetting(where, name string, e env, fallback time.Duration, p *problems) (time.Duration, bool) {
	text, set := e.values[name]
	if !set {
		if e.known[name] {
			p.add(where, "%s comes from a source not rendered here; cannot check the grace period", name)
			return 0, false
		}
		return fallback, true
	}
	d, err := parseHumanDuration(text)
	if err != nil {
		p.add(where, "%s: %v", name, err)
		return 0, false
	}
	return d, true
}

func checkWorker(where string, spec *corev1.PodSpec, c *corev1.Container, m *manifests, repo *Repo, p *problems) {
	cw := where + " container " + c.Name
	if len(c.Args) == 0 || c.Args[0] != "run" || !repo.Subcommands["run"] {
		p.add(cw, "args must start with the subcommand run, got %q", c.Args)
	}
	e := containerEnv(cw, c, m, repo, p)

	// The HTTP port: METRICS_ADDR must be set and reachable from outside the container.
	addr, ok := e.values["METRICS_ADDR"]
	var httpPort int32
	if !ok {
		p.add(cw, "METRICS_ADDR is not set: the default 127.0.0.1:9464 is loopback only, the kubelet's probes and Prometheus cannot reach it")
	} else if host, port, err := net.SplitHostPort(addr); err != nil {
		p.add(cw, "METRICS_ADDR %q: %v", addr, err)
	} else {
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
			p.add(cw, "METRICS_ADDR %q listens on loopback only: the probes and Prometheus cannot reach it", addr)
		}
		if _, err := fmt.Sscan(port, &httpPort); err != nil {
			p.add(cw, "METRICS_ADDR %q: port: %v", addr, err)
		}
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.ContainerPort == httpPort }) {
			p.add(cw, "no containerPort %d (the port of METRICS_ADDR %q)", httpPort, addr)
		}
	}

	checkProbe := func(kind string, probe *corev1.Probe, wantPath string) {
		if probe == nil {
			p.add(cw, "no %s", kind)
			return
		}
		if probe.HTTPGet == nil {
			p.add(cw, "%s must be an httpGet on %s", kind, wantPath)
			return
		}
		if probe.HTTPGet.Path != wantPath {
			p.add(cw, "%s path %q, want %q", kind, probe.HTTPGet.Path, wantPath)
		}
		if !repo.Routes[probe.HTTPGet.Path] {
			p.add(cw, "%s path %q is not a route of the worker (src/telemetry/http.rs has %v)", kind, probe.HTTPGet.Path, keys(repo.Routes))
		}
		port, ok := resolvePort(probe.HTTPGet.Port, c)
		if !ok {
			p.add(cw, "%s port %s is not a port of the container", kind, probe.HTTPGet.Port.String())
		} else if httpPort != 0 && port != httpPort {
			p.add(cw, "%s port %d is not the port of METRICS_ADDR (%d)", kind, port, httpPort)
		}
	}
	checkProbe("livenessProbe", c.LivenessProbe, livenessPath)
	checkProbe("readinessProbe", c.ReadinessProbe, readinessPath)
	if r := c.ReadinessProbe; r != nil && r.TimeoutSeconds != 0 && int64(r.TimeoutSeconds) <= int64(repo.DBPingTimeout.Seconds()) {
		p.add(cw, "readinessProbe.timeoutSeconds %d must exceed the database ping timeout of /readyz (%s)", r.TimeoutSeconds, repo.DBPingTimeout)
	}

	// Memory from the measured peak RSS.
	peak := resource.NewQuantity(repo.PeakRSSBytes, resource.BinarySI)
	if req, ok := c.Resources.Requests[corev1.ResourceMemory]; ok && req.Value() < requestOverPeak*repo.PeakRSSBytes {
		p.add(cw, "memory request %s is under %dx the measured peak RSS %s (docs/bench/results.json)", req.String(), requestOverPeak, peak)
	}
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && lim.Value() < limitOverPeak*repo.PeakRSSBytes {
		p.add(cw, "memory limit %s is under %dx the measured peak RSS %s (docs/bench/results.json)", lim.String(), limitOverPeak, peak)
	}

	// terminationGracePeriodSeconds above Settings::stop_grace.
	g, okGrace := durationSetting(cw, "SHUTDOWN_GRACE", e, repo.ShutdownGrace, p)
	_, okTimeout := durationSetting(cw, "KAFKA_REQUEST_TIMEOUT", e, repo.KafkaRequestTimeout, p)
	if okGrace && okTimeout {
		stop := repo.StopGrace(g)
		if spec.TerminationGracePeriodSeconds == nil {
			p.add(where, "terminationGracePeriodSeconds is not set (default 30 s); the worker's stop grace is %s", stop)
		} else if float64(*spec.TerminationGracePeriodSeconds) <= stop.Seconds() {
			p.add(where, "terminationGracePeriodSeconds %d must exceed the worker's stop grace %s (SHUTDOWN_GRACE %s + STOP_MARGIN %s)",
				*spec.TerminationGracePeriodSeconds, stop, g, repo.StopMargin)
		}
	}
	checkTLSPaths(cw, spec, c, e, m, true, p)
	checkPasswordFile(cw, spec, c, e, p)
	checkDatabaseSettings(cw, e, p)
	checkKafkaSettings(cw, e, p)
	checkTraceSettings(cw, e, p)
}

// setting is an env value as the worker's parsers see it (trimmed; clap
// treats an empty value as unset).
func setting(e env, name string) (string, bool) {
	v, ok := e.values[name]
	v = strings.TrimSpace(v)
	if !ok && e.known[name] {
		return "", true // from a source not rendered here
	}
	return v, ok && v != ""
}

// checkDatabaseSettings: DATABASE_POOLER is a value src/config/parse.rs takes.
func checkDatabaseSettings(where string, e env, p *problems) {
	if v, ok := setting(e, "DATABASE_POOLER"); ok && v != "" {
		switch strings.ToLower(v) {
		case "none", "session", "transaction":
		default:
			p.add(where, "DATABASE_POOLER %q is not none or transaction: the worker refuses to start (exit 2)", v)
		}
	}
}

// checkKafkaSettings mirrors the start-up checks of src/config/kafka.rs
// (security_protocol, kafka_tls): what the worker would refuse with exit 2.
func checkKafkaSettings(where string, e env, p *problems) {
	protocol, _ := setting(e, "KAFKA_SECURITY_PROTOCOL")
	protocol = strings.ToUpper(protocol)
	mechanism, hasMechanism := setting(e, "KAFKA_SASL_MECHANISM")
	switch protocol {
	case "":
		protocol = "PLAINTEXT"
		if hasMechanism {
			protocol = "SASL_PLAINTEXT"
		}
	case "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL":
	default:
		p.add(where, "KAFKA_SECURITY_PROTOCOL %q is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", protocol)
		return
	}
	if hasMechanism && mechanism != "" {
		switch strings.ToUpper(mechanism) {
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		default:
			p.add(where, "KAFKA_SASL_MECHANISM %q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", mechanism)
		}
	}
	sasl := strings.HasPrefix(protocol, "SASL_")
	tls := protocol == "SSL" || protocol == "SASL_SSL"
	switch {
	case sasl && !hasMechanism:
		p.add(where, "KAFKA_SECURITY_PROTOCOL=%s needs KAFKA_SASL_MECHANISM: the worker refuses to start (exit 2)", protocol)
	case !sasl && hasMechanism:
		p.add(where, "KAFKA_SASL_MECHANISM is set, but KAFKA_SECURITY_PROTOCOL=%s uses no SASL: the worker refuses to start (exit 2)", protocol)
	}
	if sasl {
		for _, name := range []string{"KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"} {
			if _, ok := setting(e, name); !ok {
				p.add(where, "%s is required with KAFKA_SASL_MECHANISM", name)
			}
		}
	}
	_, cert := setting(e, "KAFKA_SSL_CERTIFICATE_LOCATION")
	_, key := setting(e, "KAFKA_SSL_KEY_LOCATION")
	for _, name := range kafkaFileSettings {
		if _, ok := setting(e, name); ok && !tls {
			p.add(where, "%s is set, but KAFKA_SECURITY_PROTOCOL=%s uses no TLS: the worker refuses to start (exit 2)", name, protocol)
		}
	}
	if cert != key {
		p.add(where, "KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION go together (both or neither)")
	}
}

// checkTraceSettings: the build exports OTLP over plain HTTP with protobuf
// only (src/telemetry/trace.rs).
func checkTraceSettings(where string, e env, p *problems) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if v, ok := e.values[name]; ok && strings.TrimSpace(v) != "" && strings.TrimSpace(v) != "http/protobuf" {
			p.add(where, "%s %q: only http/protobuf is supported (the worker exits 2)", name, v)
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		v, ok := e.values[name]
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		u, err := url.Parse(strings.TrimSpace(v))
		switch {
		case err != nil:
			p.add(where, "%s %q: %v", name, v, err)
		case u.Scheme != "http" || u.Host == "":
			p.add(where, "%s %q: must be an http:// URL (OTLP over plain HTTP; the build has no TLS stack for it)", name, v)
		}
	}
}

func resolvePort(port intstr.IntOrString, c *corev1.Container) (int32, bool) {
	if port.Type == intstr.Int {
		return port.IntVal, port.IntVal > 0
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkMigrate: migrations run before the worker, in an init container
// (or a Job) of the same image, with its own direct DATABASE_URL.
func checkMigrate(where string, deploy *appsv1.Deployment, worker *corev1.Container, m *manifests, repo *Repo, p *problems) {
	c := findContainer(deploy.Spec.Template.Spec.InitContainers, migrateContainer)
	if c == nil {
		for _, job := range m.jobs {
			if jc := findContainer(job.Spec.Template.Spec.Containers, migrateContainer); jc != nil {
				c = jc
			}
		}
	}
	if c == nil {
		p.add(where, "no init container (or Job) named %q runs the migrations", migrateContainer)
		return
	}
	cw := where + " container " + c.Name
	if len(c.Args) == 0 || c.Args[0] != "migrate" || !repo.Subcommands["migrate"] {
		p.add(cw, "args must start with the subcommand migrate, got %q", c.Args)
	}
	// What `migrate` connects with (DatabaseSettings::for_migrate): the
	// direct URL when given, else DATABASE_URL unless that is a transaction
	// pooler, where migrate refuses (exit 2). The env names themselves are
	// reported by checkContainer.
	var quiet problems
	e := containerEnv(cw, c, m, repo, &quiet)
	pooler, _ := setting(e, "DATABASE_POOLER")
	if _, direct := setting(e, directURLKey); !direct && strings.EqualFold(pooler, "transaction") {
		p.add(cw, "DATABASE_POOLER=transaction and no %s: migrate needs a session past the pooler and refuses to start (exit 2)", directURLKey)
	}
	checkDatabaseSettings(cw, e, p)
	if spec := &deploy.Spec.Template.Spec; findContainer(spec.InitContainers, c.Name) == c {
		checkTLSPaths(cw, spec, c, e, m, false, p)
		checkPasswordFile(cw, spec, c, e, p)
	}
	if c.Image != worker.Image {
		p.add(cw, "image %q differs from the worker's %q: the migrations must match the binary", c.Image, worker.Image)
	}
}

func checkContainer(where string, spec *corev1.PodSpec, c *corev1.Container, image string, m *manifests, repo *Repo, p *problems) {
	cw := where + " container " + c.Name
	if c.Image == "" {
		p.add(cw, "no image")
	} else if c.Image != image {
		p.add(cw, "image %q differs from the worker's %q", c.Image, image)
	}
	for _, msg := range validation.IsDNS1123Label(c.Name) {
		p.add(cw, "name: %s", msg)
	}
	sc := c.SecurityContext
	if sc == nil {
		p.add(cw, "no securityContext")
	} else {
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			p.add(cw, "securityContext.allowPrivilegeEscalation must be false")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			p.add(cw, "securityContext.readOnlyRootFilesystem must be true")
		}
		if sc.Privileged != nil && *sc.Privileged {
			p.add(cw, "securityContext.privileged must not be true")
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			p.add(cw, "securityContext.runAsUser 0")
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, corev1.Capability("ALL")) {
			p.add(cw, "securityContext.capabilities.drop must contain ALL")
		} else if len(sc.Capabilities.Add) > 0 {
			p.add(cw, "securityContext.capabilities.add %v: the worker needs none", sc.Capabilities.Add)
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, ok := c.Resources.Requests[r]
		if !ok {
			p.add(cw, "no %s request", r)
		}
		if lim, ok := c.Resources.Limits[r]; ok && req.Cmp(lim) > 0 {
			p.add(cw, "%s request %s above its limit %s", r, req.String(), lim.String())
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		p.add(cw, "no memory limit")
	}
	for _, port := range c.Ports {
		for _, msg := range validation.IsValidPortName(port.Name) {
			p.add(cw, "port name %q: %s", port.Name, msg)
		}
	}
	if c.Name != workerContainer {
		containerEnv(cw, c, m, repo, p) // the env names and their sources
	}
	for _, mount := range c.VolumeMounts {
		if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name }) {
			p.add(cw, "volumeMount %q: no such volume", mount.Name)
		}
	}
}

// checkVolumes: Secret volumes are private to the pod's group and mounted
// whole and read-only, so a rotated certificate reaches the worker.
func checkVolumes(where string, spec *corev1.PodSpec, p *problems) {
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
			p.add(where, "volume %s: secret defaultMode must give others no access (0440 = 288)", v.Name)
		}
		for _, containers := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
			for _, c := range containers {
				for _, mount := range c.VolumeMounts {
					if mount.Name != v.Name {
						continue
					}
					if !mount.ReadOnly {
						p.add(where, "container %s: mount of secret volume %s must be readOnly", c.Name, v.Name)
					}
					if mount.SubPath != "" || mount.SubPathExpr != "" {
						p.add(where, "container %s: secret volume %s mounted with subPath: the kubelet never updates such a file, so a rotated certificate would not arrive", c.Name, v.Name)
					}
				}
			}
		}
	}
}

// checkPasswordFile: a PGPASSFILE inside a Secret volume cannot work. The
// kubelet writes a Secret's files as root's and, with fsGroup, adds group
// read to their mode (0440 at least, whatever defaultMode says); libpq
// ignores a password file its group may read, and so does the worker.
// Without fsGroup a non-root worker cannot read the file at all. The
// password comes from the Secret as PGPASSWORD instead.
func checkPasswordFile(where string, spec *corev1.PodSpec, c *corev1.Container, e env, p *problems) {
	file, ok := e.values["PGPASSFILE"]
	file = strings.TrimSpace(file)
	if !ok || file == "" {
		return
	}
	for _, mount := range c.VolumeMounts {
		mountPath := path.Clean(mount.MountPath)
		if !strings.HasPrefix(path.Clean(file), mountPath+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == mount.Name && (v.Secret != nil || v.Projected != nil) {
				p.add(where, "container %s: PGPASSFILE %s is in Secret volume %s: the kubelet makes its files root's and group-readable, and a password file its group may read is ignored (libpq's rule); give the password as PGPASSWORD from the Secret", c.Name, file, v.Name)
			}
		}
	}
}

// The Kafka settings that name a file.
var kafkaFileSettings = []string{"KAFKA_SSL_CA_LOCATION", "KAFKA_SSL_CERTIFICATE_LOCATION", "KAFKA_SSL_KEY_LOCATION"}

// checkTLSPaths: the certificate files named in DATABASE_URL and
// DATABASE_DIRECT_URL (sslrootcert, sslcert, sslkey) and, with kafka, in
// KAFKA_SSL_*_LOCATION are keys of a Secret mounted at that directory.
func checkTLSPaths(where string, spec *corev1.PodSpec, c *corev1.Container, e env, m *manifests, kafka bool, p *problems) {
	files := map[string]string{} // "SETTING param" -> path
	for _, name := range []string{"DATABASE_URL", directURLKey} {
		raw, ok := e.values[name]
		if !ok {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			p.add(where, "%s is not a URL: %v", name, err)
			continue
		}
		for _, param := range []string{"sslrootcert", "sslcert", "sslkey"} {
			if file := u.Query().Get(param); file != "" && file != "system" {
				files[name+" "+param+"="+file] = file
			}
		}
	}
	if kafka {
		for _, name := range kafkaFileSettings {
			if file, ok := e.values[name]; ok && strings.TrimSpace(file) != "" {
				files[name+"="+file] = strings.TrimSpace(file)
			}
		}
	}
	whats := make([]string, 0, len(files))
	for what := range files {
		whats = append(whats, what)
	}
	slices.Sort(whats)
	for _, what := range whats {
		file := files[what]
		if !path.IsAbs(file) {
			p.add(where, "%s: not an absolute path", what)
			continue
		}
		dir, base := path.Split(path.Clean(file))
		dir = strings.TrimSuffix(dir, "/")
		var volume *corev1.Volume
		for _, mount := range c.VolumeMounts {
			if path.Clean(mount.MountPath) == dir {
				for i := range spec.Volumes {
					if spec.Volumes[i].Name == mount.Name {
						volume = &spec.Volumes[i]
					}
				}
			}
		}
		if volume == nil {
			p.add(where, "%s: no volume mounted at %s in container %s", what, dir, c.Name)
			continue
		}
		if volume.Secret == nil {
			continue
		}
		if secret, ok := m.secrets[volume.Secret.SecretName]; ok {
			if _, ok := secretData(secret)[base]; !ok {
				p.add(where, "%s: Secret %q has no key %q", what, secret.Name, base)
			}
		}
	}
}

// checkServices returns the metrics Service, which selects the worker's pods.
func checkServices(m *manifests, podLabels labels.Set, worker *corev1.Container, p *problems) *corev1.Service {
	var metrics *corev1.Service
	for _, s := range m.services {
		where := "Service/" + s.Name
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			p.add(where, "selector %v does not select the worker's pods %v", s.Spec.Selector, podLabels)
			continue
		}
		for _, port := range s.Spec.Ports {
			if _, ok := resolvePort(port.TargetPort, worker); !ok && port.TargetPort.String() != "" {
				p.add(where, "port %s: targetPort %s is not a port of the worker", port.Name, port.TargetPort.String())
			}
		}
		if !s.Spec.PublishNotReadyAddresses {
			p.add(where, "publishNotReadyAddresses must be true: a pod whose /readyz fails must still be scraped")
		}
		metrics = s
	}
	if metrics == nil {
		p.add("rendered manifests", "no Service selects the worker's pods")
	}
	return metrics
}

func checkPDBs(m *manifests, deploy *appsv1.Deployment, podLabels labels.Set, p *problems) {
	replicas := int32(1)
	if deploy.Spec.Replicas != nil {
		replicas = *deploy.Spec.Replicas
	}
	for _, pdb := range m.pdbs {
		where := "PodDisruptionBudget/" + pdb.Name
		checkSelector(where, pdb.Spec.Selector, podLabels, p)
		switch {
		case pdb.Spec.MinAvailable != nil && pdb.Spec.MaxUnavailable != nil:
			p.add(where, "minAvailable and maxUnavailable are exclusive")
		case pdb.Spec.MaxUnavailable != nil:
			if v := pdb.Spec.MaxUnavailable; v.Type == intstr.Int && v.IntVal < 1 {
				p.add(where, "maxUnavailable %d blocks every drain", v.IntVal)
			}
		case pdb.Spec.MinAvailable != nil:
			if v := pdb.Spec.MinAvailable; v.Type == intstr.Int && v.IntVal >= replicas {
				p.add(where, "minAvailable %d with %d replicas blocks every drain", v.IntVal, replicas)
			}
		default:
			p.add(where, "neither minAvailable nor maxUnavailable")
		}
	}
}

func checkServiceMonitors(m *manifests, service *corev1.Service, repo *Repo, p *problems) {
	for _, sm := range m.serviceMonitors {
		where := "ServiceMonitor/" + sm.Name
		if service == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(service.Labels)) {
			p.add(where, "selector does not select Service/%s (labels %v)", service.Name, service.Labels)
		}
		job := service.Name
		if sm.Spec.JobLabel != "" {
			job = service.Labels[sm.Spec.JobLabel]
		}
		if job != repo.AlertJob {
			p.add(where, "the scrape job would be %q; deploy/prometheus/alerts.yml selects job=%q", job, repo.AlertJob)
		}
		if len(sm.Spec.Endpoints) == 0 {
			p.add(where, "no endpoints")
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port == "" || !slices.ContainsFunc(service.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == ep.Port }) {
				p.add(where, "endpoint port %q is not a named port of Service/%s", ep.Port, service.Name)
			}
			if ep.Path != metricsPath || !repo.Routes[ep.Path] {
				p.add(where, "endpoint path %q, want %q (a route of the worker)", ep.Path, metricsPath)
			}
		}
	}
}

// checkRules: the rendered PrometheusRule says exactly what alerts.yml says.
func checkRules(m *manifests, repo *Repo, p *problems) {
	for _, rule := range m.rules {
		if !reflect.DeepEqual(rule.Spec, repo.Alerts) {
			p.add("PrometheusRule/"+rule.Name, "spec differs from deploy/prometheus/alerts.yml: run python3 scripts/gen-prometheus-rule.py")
		}
	}
}
