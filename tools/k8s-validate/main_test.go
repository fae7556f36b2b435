package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tests break the real rendered manifests one way at a time and expect
// the validator to say so. scripts/check-deploy.sh renders the example overlay
// and passes it in K8S_VALIDATE_RENDERED (and the repository in
// K8S_VALIDATE_REPO); without them the tests are skipped.
func rendered(t *testing.T) (string, *Repo) {
	t.Helper()
	file := os.Getenv("K8S_VALIDATE_RENDERED")
	if file == "" {
		t.Skip("K8S_VALIDATE_RENDERED is not set: run scripts/check-deploy.sh")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	root := os.Getenv("K8S_VALIDATE_REPO")
	if root == "" {
		root = filepath.Join("..", "..")
	}
	repo, err := LoadRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	return string(data), repo
}

func validate(t *testing.T, text string, repo *Repo) []string {
	t.Helper()
	dec, err := newDecoder()
	if err != nil {
		t.Fatal(err)
	}
	_, problems := validateFile(dec, repo, []byte(text))
	out := make([]string, len(problems))
	for i, p := range problems {
		out[i] = p.Error()
	}
	return out
}

func TestRenderedManifestsPass(t *testing.T) {
	text, repo := rendered(t)
	if problems := validate(t, text, repo); len(problems) > 0 {
		t.Fatalf("the rendered manifests fail:\n%s", strings.Join(problems, "\n"))
	}
}

func TestEachBreakageIsCaught(t *testing.T) {
	text, repo := rendered(t)
	cases := []struct {
		name, old, new, want string
	}{
		{"unknown field in a Deployment", "  revisionHistoryLimit: 5\n", "  revisionHistoryLimit: 5\n  replica: 3\n", `unknown field "spec.replica"`},
		{"field in the wrong case", "        readOnlyRootFilesystem: true\n", "        readOnlyRootFileSystem: true\n", `unknown field`},
		{"duplicate field", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", `key "replicas" already set`},
		{"unknown field in a ServiceMonitor", "    scrapeTimeout: 10s\n", "    scrapeTimeout: 10s\n    scrape_interval: 15s\n", `unknown field`},
		{"unknown field in a PrometheusRule", "      for: 1m\n", "      for: 1m\n      severity: page\n", `unknown field`},
		{"wrong type", "  replicas: 2\n", "  replicas: two\n", `strict decode`},
		{"unregistered kind", "kind: PodDisruptionBudget\n", "kind: PodDisruptionBudgets\n", `no kind "PodDisruptionBudgets" is registered`},
		{"grace equal to the stop grace", "terminationGracePeriodSeconds: 40\n", "terminationGracePeriodSeconds: 15\n", "must exceed the worker's stop grace 15s"},
		{"longer SHUTDOWN_GRACE", "  SHUTDOWN_GRACE: 10s\n", "  SHUTDOWN_GRACE: 40s\n", "must exceed the worker's stop grace 45s"},
		{"liveness on a path the worker lacks", "path: /healthz\n", "path: /health\n", `livenessProbe path "/health"`},
		{"loopback METRICS_ADDR", "METRICS_ADDR: 0.0.0.0:9464", "METRICS_ADDR: 127.0.0.1:9464", "loopback only"},
		{"misspelt setting", "  SHUTDOWN_GRACE: 10s\n", "  SHUTDOWN_GRACE_PERIOD: 10s\n", `key "SHUTDOWN_GRACE_PERIOD" is not an environment variable`},
		{"writable root file system", "        readOnlyRootFilesystem: true\n", "        readOnlyRootFilesystem: false\n", "readOnlyRootFilesystem must be true"},
		{"capabilities kept", "            - ALL\n", "            - NET_RAW\n", "capabilities.drop must contain ALL"},
		{"privilege escalation", "          allowPrivilegeEscalation: false\n", "          allowPrivilegeEscalation: true\n", "allowPrivilegeEscalation must be false"},
		{"root", "        runAsNonRoot: true\n        runAsUser: 65532\n", "        runAsNonRoot: false\n        runAsUser: 0\n", "runAsNonRoot must be true"},
		{"no seccomp profile", "          type: RuntimeDefault\n", "          type: Unconfined\n", "seccompProfile.type must be RuntimeDefault"},
		{"memory under the measured RSS", "            memory: 48Mi\n", "            memory: 16Mi\n", "under 2x the measured peak RSS"},
		{"certificate mounted with subPath", "        - mountPath: /etc/booking-expiration/tls\n          name: tls\n", "        - mountPath: /etc/booking-expiration/tls\n          name: tls\n          subPath: ca.crt\n", "never updates such a file"},
		{"world-readable key", "          defaultMode: 288\n", "          defaultMode: 420\n", "defaultMode must give others no access"},
		{"password file in a Secret volume", "  PGPASSWORD: CHANGE-ME\n", "  PGPASSFILE: /etc/booking-expiration/tls/pgpass\n", "PGPASSFILE /etc/booking-expiration/tls/pgpass is in Secret volume tls"},
		{"migrate through the pooler (no direct URL)", "  DATABASE_DIRECT_URL: ", "  DATABASE_DIRECT_URLS: ", "DATABASE_POOLER=transaction and no DATABASE_DIRECT_URL: migrate"},
		{"the old MIGRATE_DATABASE_URL convention", "  DATABASE_DIRECT_URL: ", "  MIGRATE_DATABASE_URL: ", `key "MIGRATE_DATABASE_URL" is not an environment variable`},
		{"unknown pooler mode", "  DATABASE_POOLER: transaction\n", "  DATABASE_POOLER: statement\n", `DATABASE_POOLER "statement" is not none or transaction`},
		{"direct URL's CA outside the mount", "crm.svc:5432/crm?sslmode=verify-full&sslrootcert=/etc/booking-expiration/tls/ca.crt", "crm.svc:5432/crm?sslmode=verify-full&sslrootcert=/etc/ssl/certs/pg-ca.crt", "DATABASE_DIRECT_URL sslrootcert=/etc/ssl/certs/pg-ca.crt: no volume mounted at /etc/ssl/certs"},
		{"pooled URL's CA the Secret lacks", "crm.svc:6432/crm?sslmode=verify-full&sslrootcert=/etc/booking-expiration/tls/ca.crt", "crm.svc:6432/crm?sslmode=verify-full&sslrootcert=/etc/booking-expiration/tls/pgbouncer-ca.crt", `DATABASE_URL sslrootcert=/etc/booking-expiration/tls/pgbouncer-ca.crt: Secret "booking-expiration-tls" has no key "pgbouncer-ca.crt"`},
		{"Kafka CA outside the mount", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n", "  KAFKA_SSL_CA_LOCATION: /etc/ssl/kafka-ca.pem\n", "KAFKA_SSL_CA_LOCATION=/etc/ssl/kafka-ca.pem: no volume mounted at /etc/ssl"},
		{"Kafka CA the Secret lacks", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/kafka-ca.crt\n", `has no key "kafka-ca.crt"`},
		{"Kafka CA as a relative path", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n", "  KAFKA_SSL_CA_LOCATION: tls/ca.crt\n", "not an absolute path"},
		{"Kafka CA without TLS", "  KAFKA_SECURITY_PROTOCOL: SASL_SSL\n", "  KAFKA_SECURITY_PROTOCOL: SASL_PLAINTEXT\n", "KAFKA_SSL_CA_LOCATION is set, but KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT uses no TLS"},
		{"SASL_SSL without a mechanism", "  KAFKA_SASL_MECHANISM: SCRAM-SHA-512\n", "", "KAFKA_SECURITY_PROTOCOL=SASL_SSL needs KAFKA_SASL_MECHANISM"},
		{"SASL mechanism under SSL", "  KAFKA_SECURITY_PROTOCOL: SASL_SSL\n", "  KAFKA_SECURITY_PROTOCOL: SSL\n", "KAFKA_SASL_MECHANISM is set, but KAFKA_SECURITY_PROTOCOL=SSL uses no SASL"},
		{"SCRAM without a password", "  KAFKA_SASL_PASSWORD: CHANGE-ME\n", "", "KAFKA_SASL_PASSWORD is required with KAFKA_SASL_MECHANISM"},
		{"client certificate without its key", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n  KAFKA_SSL_CERTIFICATE_LOCATION: /etc/booking-expiration/tls/tls.crt\n", "both or neither"},
		{"OTLP over https", "  OTEL_EXPORTER_OTLP_ENDPOINT: http://", "  OTEL_EXPORTER_OTLP_ENDPOINT: https://", "must be an http:// URL"},
		{"OTLP over gRPC", "  OTEL_SERVICE_NAME: booking-expiration\n", "  OTEL_SERVICE_NAME: booking-expiration\n  OTEL_EXPORTER_OTLP_PROTOCOL: grpc\n", "only http/protobuf is supported"},
		{"misspelt OTEL variable", "  OTEL_SERVICE_NAME: booking-expiration\n", "  OTEL_SERVICE: booking-expiration\n", `key "OTEL_SERVICE" is not an environment variable`},
		{"certificate the Secret lacks", "sslrootcert=/etc/booking-expiration/tls/ca.crt", "sslrootcert=/etc/booking-expiration/tls/root.crt", `has no key "root.crt"`},
		{"not-ready pods not scraped", "  publishNotReadyAddresses: true\n", "  publishNotReadyAddresses: false\n", "publishNotReadyAddresses must be true"},
		{"scrape job the alerts do not select", "  jobLabel: app.kubernetes.io/name\n", "  jobLabel: app.kubernetes.io/component\n", `the scrape job would be "metrics"`},
		{"alert changed in the PrometheusRule only", "      for: 1m\n", "      for: 2m\n", "differs from deploy/prometheus/alerts.yml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(text, tc.old) {
				t.Fatalf("the rendered manifests no longer contain %q: update this case", tc.old)
			}
			broken := strings.Replace(text, tc.old, tc.new, 1)
			problems := validate(t, broken, repo)
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Fatalf("no problem mentions %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
		})
	}
}

// Other valid set-ups, made from the example overlay, must pass too (the
// checks follow the worker's rules, not the example's values).
func TestValidVariantsPass(t *testing.T) {
	text, repo := rendered(t)
	cases := []struct {
		name     string
		replaces [][2]string
	}{
		{"no pooler, no direct URL: migrate uses DATABASE_URL", [][2]string{
			{"  DATABASE_POOLER: transaction\n", ""},
			{"  DATABASE_DIRECT_URL: ", ""}, // a prefix: the whole line goes
		}},
		{"pooler in session mode", [][2]string{{"  DATABASE_POOLER: transaction\n", "  DATABASE_POOLER: session\n"}}},
		{"Kafka CA from the bundled roots", [][2]string{{"  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n", ""}}},
		{"Kafka mutual TLS without SASL", [][2]string{
			{"  KAFKA_SASL_MECHANISM: SCRAM-SHA-512\n", ""},
			{"  KAFKA_SECURITY_PROTOCOL: SASL_SSL\n", "  KAFKA_SECURITY_PROTOCOL: ssl\n"},
			{"  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n", "  KAFKA_SSL_CA_LOCATION: /etc/booking-expiration/tls/ca.crt\n  KAFKA_SSL_CERTIFICATE_LOCATION: /etc/booking-expiration/tls/tls.crt\n  KAFKA_SSL_KEY_LOCATION: /etc/booking-expiration/tls/tls.key\n"},
		}},
		{"no span export", [][2]string{{"  OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector.observability.svc:4318\n", ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changed := text
			for _, r := range tc.replaces {
				if !strings.Contains(changed, r[0]) {
					t.Fatalf("the rendered manifests no longer contain %q: update this case", r[0])
				}
				if r[1] == "" && !strings.HasSuffix(r[0], "\n") {
					start := strings.Index(changed, r[0])
					end := start + strings.Index(changed[start:], "\n") + 1
					changed = changed[:start] + changed[end:]
					continue
				}
				changed = strings.Replace(changed, r[0], r[1], 1)
			}
			if problems := validate(t, changed, repo); len(problems) > 0 {
				t.Fatalf("a valid variant fails:\n%s", strings.Join(problems, "\n"))
			}
		})
	}
}

func TestHumanDurations(t *testing.T) {
	for text, want := range map[string]string{"10s": "10s", "500ms": "500ms", "1m 30s": "1m30s", "2min": "2m0s", "1h": "1h0m0s"} {
		got, err := parseHumanDuration(text)
		if err != nil || got.String() != want {
			t.Errorf("%q: got %v, %v; want %s", text, got, err, want)
		}
	}
	for _, bad := range []string{"", "10", "ten seconds", "10 parsecs"} {
		if _, err := parseHumanDuration(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
