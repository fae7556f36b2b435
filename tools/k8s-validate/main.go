// Command k8s-validate checks rendered Kubernetes manifests offline, without a
// cluster: a strict decode of every object into the official API types, then
// semantic checks against the worker's own sources.
//
//	k8s-validate [-repo DIR] RENDERED.yaml...
//
// Each RENDERED.yaml is the output of one `kustomize build` (several YAML
// documents). Exit status 0 when every check passes, 1 otherwise; each problem
// is one line naming the file, the object and the field.
//
// The strict decode is the one the API server applies with
// fieldValidation=Strict: apimachinery's strict serializer (unknown fields,
// duplicate fields and wrong-case field names are errors) into k8s.io/api
// (core/v1, apps/v1, policy/v1, batch/v1) and the prometheus-operator's
// monitoring/v1 types (ServiceMonitor, PrometheusRule). A kind not registered
// here is an error too, so nothing passes unchecked. What it cannot do is what
// only a cluster does: admission webhooks, the CRDs' OpenAPI validation, quota.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// object is one decoded document of a rendered file.
type object struct {
	index int // 1-based position in the file
	kind  string
	name  string
	obj   runtime.Object
}

func (o object) String() string { return fmt.Sprintf("%s/%s (document %d)", o.kind, o.name, o.index) }

// newDecoder returns the strict universal deserializer for the kinds a
// deployment of the worker may contain.
func newDecoder() (runtime.Decoder, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme,
		appsv1.AddToScheme,
		policyv1.AddToScheme,
		batchv1.AddToScheme,
		monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer(), nil
}

// decodeAll splits a rendered file into documents and decodes each strictly.
// Returns the objects that decoded and one error per document that did not.
func decodeAll(dec runtime.Decoder, data []byte) ([]object, []error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objects []object
	var problems []error
	for index := 1; ; index++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("document %d: %w", index, err))
			break
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			index--
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			what := "document"
			if gvk != nil {
				what = gvk.Kind
			}
			problems = append(problems, fmt.Errorf("%s %d: strict decode: %w", what, index, err))
			// A strict error (unknown or duplicate field) still yields the
			// object: keep it, so the semantic checks say no more than they must.
			if obj == nil || !runtime.IsStrictDecodingError(err) {
				continue
			}
		}
		name := ""
		if meta, ok := obj.(interface{ GetName() string }); ok {
			name = meta.GetName()
		}
		objects = append(objects, object{index: index, kind: gvk.Kind, name: name, obj: obj})
	}
	if len(objects) == 0 && len(problems) == 0 {
		problems = append(problems, errors.New("no Kubernetes object in the file"))
	}
	return objects, problems
}

// validateFile runs the strict decode and the semantic checks on one rendered file.
func validateFile(dec runtime.Decoder, repo *Repo, data []byte) (int, []error) {
	objects, problems := decodeAll(dec, data)
	problems = append(problems, semanticChecks(objects, repo)...)
	return len(objects), problems
}

func main() {
	repoDir := flag.String("repo", ".", "root of the booking-expiration repository (sources read by the semantic checks)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: k8s-validate [-repo DIR] RENDERED.yaml...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	dec, err := newDecoder()
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-validate: scheme: %v\n", err)
		os.Exit(1)
	}
	repo, err := LoadRepo(*repoDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-validate: %v\n", err)
		os.Exit(1)
	}
	failed := false
	for _, path := range flag.Args() {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-validate: %v\n", err)
			failed = true
			continue
		}
		count, problems := validateFile(dec, repo, data)
		label := filepath.Base(path)
		for _, problem := range problems {
			fmt.Printf("FAIL %s: %v\n", label, problem)
		}
		if len(problems) > 0 {
			failed = true
			fmt.Printf("%s: %d objects, %d problems\n", label, count, len(problems))
		} else {
			fmt.Printf("%s: %d objects decoded strictly (%s), semantic checks passed\n", label, count, strings.Join(kinds(data, dec), ", "))
		}
	}
	if failed {
		os.Exit(1)
	}
}

// kinds lists the kinds of a file that decoded, for the summary line.
func kinds(data []byte, dec runtime.Decoder) []string {
	objects, _ := decodeAll(dec, data)
	out := make([]string, 0, len(objects))
	for _, o := range objects {
		out = append(out, o.kind)
	}
	return out
}
