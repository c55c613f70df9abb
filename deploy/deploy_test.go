package deploy_test

// Static checks of the deployment files (docker-compose.yml, Dockerfile).
// Docker is not needed: the compose file is loaded with compose-go, the
// library docker compose itself uses, with schema validation, path
// resolution and its consistency checks all on.

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/graph"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/jackc/pgx/v5/pgconn"
)

const composeFile = "docker-compose.yml"

var (
	roachNodes   = []string{"roach1", "roach2", "roach3"}
	wantServices = []string{"roach1", "roach2", "roach3", "init", "schema", "worker", "producer"}
)

// repoRoot is the repository root: go test runs a package's tests in its
// directory, deploy/, a module of its own (so that compose-go stays out of
// the library's go.mod) one level below the root.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("not at the repository root (no go.mod): %v", err)
	}
	return dir
}

// loadCompose loads a compose file the way `docker compose` does: JSON
// schema validation, interpolation, relative paths resolved against the
// working dir, and the loader's consistency checks (unknown depends_on
// targets, undefined volumes, healthcheck form, ...). content, when not nil,
// replaces the file's text.
func loadCompose(t *testing.T, content []byte) (*types.Project, error) {
	t.Helper()
	root := repoRoot(t)
	details := types.ConfigDetails{
		WorkingDir: root,
		ConfigFiles: []types.ConfigFile{{
			Filename: filepath.Join(root, composeFile),
			Content:  content,
		}},
		// No variables from the test's environment leak into the model.
		Environment: types.Mapping{},
	}
	return loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("crdbwork", true)
		o.SkipValidation = false
		o.SkipConsistencyCheck = false
		o.SkipInterpolation = false
		o.ResolvePaths = true
	})
}

func mustLoadCompose(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadCompose(t, nil)
	if err != nil {
		t.Fatalf("load %s: %v", composeFile, err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("service %q: %v", name, err)
	}
	return s
}

// checkDependsOn reports every depends_on entry that names no service of
// the project. compose-go's own consistency check covers this too; this one
// does not depend on how the loader was configured.
func checkDependsOn(p *types.Project) []error {
	var errs []error
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		for dep := range s.DependsOn {
			if _, ok := p.Services[dep]; !ok {
				errs = append(errs, fmt.Errorf("service %q depends on unknown service %q", name, dep))
			}
		}
	}
	return errs
}

func TestComposeLoads(t *testing.T) {
	p := mustLoadCompose(t)
	if p.Name != "crdbwork" {
		t.Errorf("project name = %q, want crdbwork", p.Name)
	}
	for _, name := range wantServices {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("service %q missing; have %v", name, p.ServiceNames())
		}
	}
	if len(p.DisabledServices) != 0 {
		t.Errorf("services disabled by profiles: %v", p.DisabledServiceNames())
	}
	if err := graph.CheckCycle(p); err != nil {
		t.Errorf("depends_on cycle: %v", err)
	}
	for _, err := range checkDependsOn(p) {
		t.Error(err)
	}
}

// TestComposeDependsOnCheckFails makes sure a misspelled depends_on target is
// caught, both by the loader and by checkDependsOn.
func TestComposeDependsOnCheckFails(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(repoRoot(t), composeFile))
	if err != nil {
		t.Fatal(err)
	}
	const from = "      schema:\n        condition: service_completed_successfully\n"
	if !strings.Contains(string(text), from) {
		t.Fatalf("%s has no depends_on on schema to misspell", composeFile)
	}
	broken := strings.Replace(string(text), from, strings.Replace(from, "schema:", "shema:", 1), 1)
	if _, err := loadCompose(t, []byte(broken)); err == nil || !strings.Contains(err.Error(), "shema") {
		t.Errorf("loader accepted a depends_on on an unknown service (err = %v)", err)
	}

	p := mustLoadCompose(t)
	w := p.Services["worker"]
	w.DependsOn = types.DependsOnConfig{"shema": {Condition: types.ServiceConditionCompletedSuccessfully, Required: true}}
	p.Services["worker"] = w
	if errs := checkDependsOn(p); len(errs) != 1 {
		t.Errorf("checkDependsOn on a misspelled target: %v, want one error", errs)
	}
}

// TestComposeRejectsUnknownKeys checks that schema validation is really on.
func TestComposeRejectsUnknownKeys(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(repoRoot(t), composeFile))
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(text), "    stop_grace_period: 15s\n", "    stop_grace_perod: 15s\n", 1)
	if broken == string(text) {
		t.Fatal("no stop_grace_period line to misspell")
	}
	if _, err := loadCompose(t, []byte(broken)); err == nil {
		t.Error("loader accepted an unknown service attribute")
	}
}

func TestComposeDependencyOrder(t *testing.T) {
	p := mustLoadCompose(t)
	want := map[string]map[string]string{
		// Nodes become healthy only after init, so init waits for "started".
		"init": {
			"roach1": types.ServiceConditionStarted,
			"roach2": types.ServiceConditionStarted,
			"roach3": types.ServiceConditionStarted,
		},
		"schema": {
			"init":   types.ServiceConditionCompletedSuccessfully,
			"roach1": types.ServiceConditionHealthy,
			"roach2": types.ServiceConditionHealthy,
			"roach3": types.ServiceConditionHealthy,
		},
		// The producer creates the demo's tables and queue (the demo works
		// only on queues it created); the workers start after it.
		"worker": {
			"schema":   types.ServiceConditionCompletedSuccessfully,
			"producer": types.ServiceConditionCompletedSuccessfully,
		},
		"producer": {"schema": types.ServiceConditionCompletedSuccessfully},
	}
	for name, deps := range want {
		s := service(t, p, name)
		for dep, cond := range deps {
			got, ok := s.DependsOn[dep]
			if !ok {
				t.Errorf("%s: no depends_on %s", name, dep)
				continue
			}
			if got.Condition != cond {
				t.Errorf("%s: depends_on %s condition = %q, want %q", name, dep, got.Condition, cond)
			}
		}
	}
}

func flagValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
		if a == flag && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func TestComposeCockroachCluster(t *testing.T) {
	p := mustLoadCompose(t)
	for _, name := range roachNodes {
		s := service(t, p, name)
		if !strings.HasPrefix(s.Image, "cockroachdb/cockroach:v") {
			t.Errorf("%s: image %q, want a pinned cockroachdb/cockroach:vX.Y.Z", name, s.Image)
		}
		if !regexp.MustCompile(`:v2[45]\.\d+\.\d+$`).MatchString(s.Image) {
			t.Errorf("%s: image %q is not a pinned v24/v25 release", name, s.Image)
		}
		args := []string(s.Command)
		if len(args) == 0 || args[0] != "start" {
			t.Errorf("%s: command %q does not run `start`", name, args)
			continue
		}
		if !slices.Contains(args, "--insecure") {
			t.Errorf("%s: not started with --insecure: %q", name, args)
		}
		join, ok := flagValue(args, "--join")
		if !ok {
			t.Errorf("%s: no --join", name)
		}
		var joined []string
		for _, h := range strings.Split(join, ",") {
			host, _, _ := strings.Cut(strings.TrimSpace(h), ":")
			joined = append(joined, host)
		}
		sort.Strings(joined)
		if !slices.Equal(joined, roachNodes) {
			t.Errorf("%s: --join=%s, want all of %v", name, join, roachNodes)
		}
		for _, flag := range []string{"--listen-addr", "--advertise-addr"} {
			if v, _ := flagValue(args, flag); v != name+":26257" {
				t.Errorf("%s: %s=%q, want %s:26257", name, flag, v, name)
			}
		}
		if v, _ := flagValue(args, "--http-addr"); !strings.HasSuffix(v, ":8080") {
			t.Errorf("%s: --http-addr=%q, want port 8080 (healthcheck)", name, v)
		}
		store, ok := flagValue(args, "--store")
		if !ok {
			t.Errorf("%s: no --store", name)
		}
		storePath := strings.TrimPrefix(store, "path=")
		var mounted bool
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeVolume && v.Target == storePath {
				if _, ok := p.Volumes[v.Source]; !ok {
					t.Errorf("%s: store volume %q is not a named volume", name, v.Source)
				}
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("%s: store %q is not on a named volume", name, storePath)
		}
		hc := s.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) < 2 || hc.Test[0] != "CMD" {
			t.Errorf("%s: healthcheck %+v, want a CMD test", name, hc)
		} else if !strings.Contains(strings.Join(hc.Test, " "), "/health?ready=1") {
			t.Errorf("%s: healthcheck %q does not probe /health?ready=1", name, hc.Test)
		}
	}

	// Only roach1 is published, on loopback.
	published := map[uint32]bool{}
	for _, name := range p.ServiceNames() {
		for _, port := range p.Services[name].Ports {
			if name != "roach1" {
				t.Errorf("%s publishes port %d; only roach1 should", name, port.Target)
			}
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s: port %d published on %q, want 127.0.0.1", name, port.Target, port.HostIP)
			}
			published[port.Target] = true
		}
	}
	for _, port := range []uint32{26257, 8080} {
		if !published[port] {
			t.Errorf("roach1: port %d not published", port)
		}
	}
}

func TestComposeInit(t *testing.T) {
	p := mustLoadCompose(t)
	s := service(t, p, "init")
	script := strings.Join(append(slices.Clone([]string(s.Entrypoint)), s.Command...), " ")
	for _, want := range []string{"cockroach init", "--insecure", "--host=roach1:26257", "already been initialized"} {
		if !strings.Contains(script, want) {
			t.Errorf("init: command lacks %q:\n%s", want, script)
		}
	}
	// `$$` in the file must reach the shell as `$`.
	if strings.Contains(script, "$$") || !strings.Contains(script, "$(/cockroach/cockroach init") {
		t.Errorf("init: shell substitutions not unescaped:\n%s", script)
	}
	if strings.Contains(script, "|| true") {
		t.Errorf("init: ignores every failure of cockroach init:\n%s", script)
	}
}

func TestComposeSchema(t *testing.T) {
	root := repoRoot(t)
	p := mustLoadCompose(t)
	s := service(t, p, "schema")
	script := strings.Join(append(slices.Clone([]string(s.Entrypoint)), s.Command...), " ")
	for _, want := range []string{
		"CREATE DATABASE IF NOT EXISTS crdbwork",
		"postgresql://root@roach1:26257/crdbwork?sslmode=disable",
		"--file /sql/schema.sql",
		"--file /sql/cockroach.sql",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("schema: command lacks %q:\n%s", want, script)
		}
	}
	if strings.Index(script, "/sql/schema.sql") > strings.Index(script, "/sql/cockroach.sql") {
		t.Errorf("schema: cockroach.sql must be applied after schema.sql")
	}

	sqlDir := filepath.Join(root, "sql")
	var found bool
	for _, v := range s.Volumes {
		if v.Target != "/sql" {
			continue
		}
		found = true
		if v.Type != types.VolumeTypeBind {
			t.Errorf("schema: /sql is a %s mount, want bind", v.Type)
		}
		if filepath.Clean(v.Source) != sqlDir {
			t.Errorf("schema: /sql mounts %q, want %q", v.Source, sqlDir)
		}
		if !v.ReadOnly {
			t.Errorf("schema: /sql is writable, want read-only")
		}
	}
	if !found {
		t.Fatalf("schema: nothing mounted at /sql: %+v", s.Volumes)
	}
	for _, f := range []string{"schema.sql", "cockroach.sql"} {
		if fi, err := os.Stat(filepath.Join(sqlDir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("sql/%s: missing or empty (%v)", f, err)
		}
	}
}

// dockerfilePath is the Dockerfile a service builds from, resolved.
func dockerfilePath(b *types.BuildConfig) string {
	df := b.Dockerfile
	if df == "" {
		df = "Dockerfile"
	}
	if !filepath.IsAbs(df) {
		df = filepath.Join(b.Context, df)
	}
	return filepath.Clean(df)
}

func TestComposeDemoServices(t *testing.T) {
	root := repoRoot(t)
	p := mustLoadCompose(t)
	dockerfile := filepath.Join(root, "Dockerfile")

	for name, sub := range map[string]string{"worker": "work", "producer": "enqueue"} {
		s := service(t, p, name)
		if s.Build == nil {
			t.Errorf("%s: no build section", name)
			continue
		}
		if filepath.Clean(s.Build.Context) != root {
			t.Errorf("%s: build context %q, want %q", name, s.Build.Context, root)
		}
		if got := dockerfilePath(s.Build); got != dockerfile {
			t.Errorf("%s: builds from %q, want %q", name, got, dockerfile)
		}
		if len(s.Command) == 0 || s.Command[0] != sub {
			t.Errorf("%s: command %q, want subcommand %q first", name, s.Command, sub)
		}
		// The demo's services run the image's entrypoint, the demo (the
		// image also holds /crdbwork, the operator's command).
		if len(s.Entrypoint) != 0 {
			t.Errorf("%s: entrypoint %q, want the image's (the demo)", name, s.Entrypoint)
		}

		raw, ok := s.Environment["DATABASE_URL"]
		if !ok || raw == nil || *raw == "" {
			t.Errorf("%s: DATABASE_URL not set", name)
			continue
		}
		cfg, err := pgconn.ParseConfig(*raw)
		if err != nil {
			t.Errorf("%s: DATABASE_URL %q: %v", name, *raw, err)
			continue
		}
		hosts := []string{cfg.Host}
		for _, fb := range cfg.Fallbacks {
			if fb.Host != cfg.Host {
				hosts = append(hosts, fb.Host)
			}
		}
		for _, h := range hosts {
			if !slices.Contains(roachNodes, h) {
				t.Errorf("%s: DATABASE_URL host %q is not a cockroach service", name, h)
			}
		}
		if cfg.Port != 26257 || cfg.Database != "crdbwork" || cfg.User != "root" {
			t.Errorf("%s: DATABASE_URL %q: want root@…:26257/crdbwork", name, *raw)
		}
		if u, err := url.Parse(*raw); err != nil || u.Query().Get("sslmode") != "disable" {
			t.Errorf("%s: DATABASE_URL %q: want sslmode=disable for the insecure cluster", name, *raw)
		}
	}

	w := service(t, p, "worker")
	if slices.Index([]string(w.Command), "--queue") < 0 {
		t.Errorf("worker: command %q names no --queue", w.Command)
	}
	if w.Deploy == nil || w.Deploy.Replicas == nil || *w.Deploy.Replicas < 2 {
		t.Errorf("worker: want deploy.replicas >= 2, have %+v", w.Deploy)
	}
	if w.ContainerName != "" {
		t.Errorf("worker: container_name %q prevents replicas", w.ContainerName)
	}
	if w.StopGracePeriod == nil || w.StopGracePeriod.String() != "15s" {
		t.Errorf("worker: stop_grace_period = %v, want 15s", w.StopGracePeriod)
	}
}

// dockerfileFroms returns the image of every FROM line, in order.
func dockerfileFroms(t *testing.T, text string) []string {
	t.Helper()
	var froms []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && strings.EqualFold(fields[0], "FROM") {
			img := fields[1]
			if strings.HasPrefix(img, "--") && len(fields) >= 3 { // --platform=...
				img = fields[2]
			}
			froms = append(froms, img)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return froms
}

// goDirective returns go.mod's `go` version as major.minor.
func goDirective(t *testing.T, root string) string {
	t.Helper()
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go\s+(\d+)\.(\d+)`).FindStringSubmatch(string(mod))
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return m[1] + "." + m[2]
}

func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	froms := dockerfileFroms(t, text)
	if len(froms) < 2 {
		t.Fatalf("Dockerfile: want a multi-stage build, FROM lines: %q", froms)
	}

	want := goDirective(t, root)
	m := regexp.MustCompile(`^(?:docker\.io/)?(?:library/)?golang:(\d+)\.(\d+)(?:[.-]|$)`).FindStringSubmatch(froms[0])
	if m == nil {
		t.Fatalf("Dockerfile: first stage %q is not a golang:X.Y image", froms[0])
	}
	if got := m[1] + "." + m[2]; got != want {
		t.Errorf("Dockerfile: golang %s, go.mod says go %s", got, want)
	}
	if last := froms[len(froms)-1]; strings.HasPrefix(last, "golang") {
		t.Errorf("Dockerfile: final stage %q ships the Go toolchain", last)
	}

	for _, want := range []string{
		"go mod download",
		"CGO_ENABLED=0 go build -trimpath -o /out/demo ./cmd/demo",
		"CGO_ENABLED=0 go build -trimpath -o /out/crdbwork ./cmd/crdbwork",
		"COPY --from=build /out/crdbwork /crdbwork",
		"COPY --from=",
		`ENTRYPOINT ["/demo"]`,
		`CMD ["work"]`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// go.mod/go.sum are copied and downloaded before the sources, so the
	// module layer survives source edits.
	if i, j := strings.Index(text, "go mod download"), strings.Index(text, "COPY . ."); i < 0 || j < 0 || i > j {
		t.Errorf("Dockerfile: `go mod download` must come before `COPY . .`")
	}

	// The build context must keep what the build needs.
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ignore), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, keep := range []string{"go.mod", "go.sum", "sql", "cmd", "*.go", "*.sql"} {
			if line == keep || line == "**/"+keep || line == "*" {
				t.Errorf(".dockerignore excludes %q, which the build needs", line)
			}
		}
	}
}
