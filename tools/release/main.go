// Command release keeps idem's modules publishable and rehearses a
// release without publishing anything. docs/releasing.md describes the
// scheme; in short: every go.mod of the repository but tools/ and those
// marked with an "// idem:unpublished" comment is published, carries no
// replace directive and requires the other modules of the repository at
// one version, the development version; go.work joins them for work.
//
//	release check             the scheme holds (no replace, one version, go.work and MODULES list every module)
//	release convert DIR...    bring modules to the scheme (drop the in-repo replaces, pin the in-repo requires)
//	release proxy DIR         write a file-system module proxy of the working tree at the development version
//	release tidy DIR...       go mod tidy there (a module of the scheme cannot be tidied without the proxy)
//	release tidy-check        go mod tidy -diff in every module, resolving the repository's modules through that proxy
//	release rehearse          go install the programs and build a fresh consumer of every library, through the proxy
//
// Run it from tools/ with GOWORK=off (make tidy-check, make release-check);
// -root names the repository (default ..).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// RepoModule is the core module's path; every module of the repository is
// it or below it.
const RepoModule = "github.com/idemkit/idem"

// DevVersionDefault is the version modules require of each other when the
// repository does not say yet (convert on a tree where no module requires
// another).
const DevVersionDefault = "v0.1.0"

// unpublishedMark in a go.mod keeps the module out of the release: it may
// keep replace directives and nothing published may require it.
const unpublishedMark = "idem:unpublished"

func main() {
	root := flag.String("root", "..", "the repository's root directory")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: release [-root DIR] check|convert DIR...|proxy DIR|tidy-check|rehearse")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		fail(err)
	}
	r, err := load(abs)
	if err != nil {
		fail(err)
	}
	args := flag.Args()[1:]
	switch flag.Arg(0) {
	case "check":
		err = r.check()
	case "convert":
		err = r.convert(args)
	case "proxy":
		if len(args) != 1 {
			fail(errors.New("proxy: one directory"))
		}
		var v string
		if v, err = r.version(); err == nil {
			err = r.writeProxy(args[0], v)
		}
	case "tidy-check":
		err = r.tidyCheck()
	case "tidy":
		err = r.tidy(args)
	case "rehearse":
		err = r.rehearse()
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "release:", err)
	os.Exit(1)
}

// Module is one go.mod of the repository.
type Module struct {
	Dir       string // relative to the root, "." for the core
	Path      string
	File      *modfile.File
	Published bool
}

type repo struct {
	root    string
	modules []*Module // sorted by Dir
}

// skipDir is a directory that holds no module of the repository: hidden
// ones (.git, .bin, .release: the rehearsal's own module cache), testdata
// and tools/ (the tool module, never published).
func skipDir(rel, name string) bool {
	return rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || rel == "tools" || rel == "tmp" || name == "node_modules")
}

func load(root string) (*repo, error) {
	r := &repo{root: root}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if skipDir(rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(p, data, nil)
		if err != nil {
			return err
		}
		if f.Module == nil {
			return fmt.Errorf("%s: no module line", p)
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		want := RepoModule
		if dir != "." {
			want = RepoModule + "/" + dir
		}
		if f.Module.Mod.Path != want {
			return fmt.Errorf("%s: module %s, want %s (a module's path is its directory)", p, f.Module.Mod.Path, want)
		}
		r.modules = append(r.modules, &Module{Dir: dir, Path: want, File: f, Published: !bytes.Contains(data, []byte(unpublishedMark))})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(r.modules, func(i, j int) bool { return r.modules[i].Dir < r.modules[j].Dir })
	if len(r.modules) == 0 || r.modules[0].Dir != "." {
		return nil, fmt.Errorf("%s: no go.mod at the root", root)
	}
	return r, nil
}

func (r *repo) byPath(p string) *Module {
	for _, m := range r.modules {
		if m.Path == p {
			return m
		}
	}
	return nil
}

func (r *repo) published() []*Module {
	var out []*Module
	for _, m := range r.modules {
		if m.Published {
			out = append(out, m)
		}
	}
	return out
}

// version is the development version: the one version at which the
// published modules require each other.
func (r *repo) version() (string, error) {
	seen := map[string]string{}
	for _, m := range r.published() {
		for _, req := range m.File.Require {
			if r.byPath(req.Mod.Path) != nil && req.Mod.Version != "v0.0.0" { // the replace scheme's placeholder: convert's to fix
				seen[req.Mod.Version] = m.Dir + " requires " + req.Mod.Path + " " + req.Mod.Version
			}
		}
	}
	switch len(seen) {
	case 0:
		return DevVersionDefault, nil
	case 1:
		for v := range seen {
			return v, nil
		}
	}
	var lines []string
	for _, why := range seen {
		lines = append(lines, why)
	}
	sort.Strings(lines)
	return "", fmt.Errorf("the modules require each other at different versions (run release convert):\n\t%s", strings.Join(lines, "\n\t"))
}

func (r *repo) check() error {
	var problems []string
	for _, m := range r.published() {
		for _, rep := range m.File.Replace {
			problems = append(problems, fmt.Sprintf("%s/go.mod: replace %s => %s: a published module has no replace (go install refuses it, and a user's build ignores it); go.work joins the modules for development", m.Dir, rep.Old.Path, rep.New.Path))
		}
		for _, req := range m.File.Require {
			dep := r.byPath(req.Mod.Path)
			if dep == nil {
				continue
			}
			if !dep.Published {
				problems = append(problems, fmt.Sprintf("%s/go.mod: requires %s, which is marked %s", m.Dir, req.Mod.Path, unpublishedMark))
			}
			if semverBad(req.Mod.Version) {
				problems = append(problems, fmt.Sprintf("%s/go.mod: requires %s %s: not a release version", m.Dir, req.Mod.Path, req.Mod.Version))
			}
		}
	}
	if _, err := r.version(); err != nil {
		problems = append(problems, err.Error())
	}
	if v, err := r.version(); err == nil {
		wp, err := r.workProblems(v)
		if err != nil {
			return err
		}
		problems = append(problems, wp...)
	}
	listed, err := r.makefileModules()
	if err != nil {
		return err
	}
	for _, m := range r.modules {
		if !listed[m.Dir] {
			problems = append(problems, fmt.Sprintf("%s: not in the Makefile's MODULES (make test would not vet or test it)", m.Dir))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the module graph is not publishable:\n\t%s", strings.Join(problems, "\n\t"))
	}
	var names []string
	for _, m := range r.published() {
		names = append(names, m.Dir)
	}
	v, _ := r.version()
	fmt.Printf("release check: %d published modules at %s, no replace: %s\n", len(names), v, strings.Join(names, " "))
	return nil
}

// semverBad reports a version that a proxy could not serve as a tag: the
// v0.0.0 placeholder of the replace scheme, or not semver at all.
func semverBad(v string) bool {
	return v == "v0.0.0" || !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(v)
}

func (r *repo) readWork() (*modfile.WorkFile, error) {
	data, err := os.ReadFile(filepath.Join(r.root, "go.work"))
	if err != nil {
		return nil, err
	}
	return modfile.ParseWork("go.work", data, nil)
}

func cleanDir(p string) string {
	return path.Clean(strings.TrimPrefix(filepath.ToSlash(p), "./"))
}

// workProblems compares go.work with the modules: each is in its use list,
// and each published one is replaced, at the development version only, by
// its directory. The go command reads the go.mod of every version in the
// module graph, a workspace module's included; these replaces let it read
// the tree's instead of asking a proxy for a version not yet tagged. They
// live only in go.work, which no user ever sees.
func (r *repo) workProblems(v string) ([]string, error) {
	wf, err := r.readWork()
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, u := range wf.Use {
		used[cleanDir(u.Path)] = true
	}
	replaced := map[string]string{}
	for _, rep := range wf.Replace {
		if r.byPath(rep.Old.Path) != nil {
			replaced[rep.Old.Path+" "+rep.Old.Version] = cleanDir(rep.New.Path)
		}
	}
	var problems []string
	for _, m := range r.modules {
		if !used[m.Dir] {
			problems = append(problems, fmt.Sprintf("%s: not in go.work's use list (run release convert %s)", m.Dir, m.Dir))
		}
		if !m.Published {
			continue
		}
		key := m.Path + " " + v
		if replaced[key] != m.Dir {
			problems = append(problems, fmt.Sprintf("go.work: no replace %s %s => ./%s (run release convert)", m.Path, v, m.Dir))
		}
		delete(replaced, key)
	}
	for k, dir := range replaced {
		problems = append(problems, fmt.Sprintf("go.work: replace %s => ./%s is not one of the development version's (run release convert)", k, dir))
	}
	sort.Strings(problems)
	return problems, nil
}

// syncWork writes go.work's use list and replaces for the modules at v.
func (r *repo) syncWork(v string) error {
	wf, err := r.readWork()
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, u := range wf.Use {
		used[cleanDir(u.Path)] = true
	}
	for _, rep := range wf.Replace {
		if r.byPath(rep.Old.Path) != nil {
			if err := wf.DropReplace(rep.Old.Path, rep.Old.Version); err != nil {
				return err
			}
		}
	}
	for _, m := range r.modules {
		rel := "./" + m.Dir
		if m.Dir == "." {
			rel = "."
		}
		if !used[m.Dir] {
			if err := wf.AddUse(rel, m.Path); err != nil {
				return err
			}
		}
		if m.Published {
			if m.Dir == "." {
				rel = "./"
			}
			if err := wf.AddReplace(m.Path, v, rel, ""); err != nil {
				return err
			}
		}
	}
	wf.SortBlocks()
	wf.Cleanup()
	return os.WriteFile(filepath.Join(r.root, "go.work"), modfile.Format(wf.Syntax), 0o644)
}

func (r *repo) makefileModules() (map[string]bool, error) {
	data, err := os.ReadFile(filepath.Join(r.root, "Makefile"))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "MODULES :=") && !strings.HasPrefix(line, "MODULES +=") {
			continue
		}
		for _, f := range strings.Fields(line[len("MODULES :="):]) {
			out[path.Clean(f)] = true
		}
	}
	return out, nil
}

// convert brings the named module directories (all published ones when
// none is named) to the scheme: in-repo replaces dropped, in-repo requires
// at the development version, the module in go.work.
func (r *repo) convert(dirs []string) error {
	v, err := r.version()
	if err != nil {
		return err
	}
	targets := r.published()
	if len(dirs) > 0 {
		targets = nil
		for _, d := range dirs {
			d = path.Clean(filepath.ToSlash(d))
			var found *Module
			for _, m := range r.modules {
				if m.Dir == d {
					found = m
				}
			}
			if found == nil {
				return fmt.Errorf("convert: no module in %s", d)
			}
			targets = append(targets, found)
		}
	}
	for _, m := range targets {
		for _, rep := range m.File.Replace {
			if r.byPath(rep.Old.Path) != nil {
				if err := m.File.DropReplace(rep.Old.Path, rep.Old.Version); err != nil {
					return err
				}
			}
		}
		for _, req := range m.File.Require {
			if r.byPath(req.Mod.Path) != nil && req.Mod.Version != v {
				if err := m.File.AddRequire(req.Mod.Path, v); err != nil {
					return err
				}
			}
		}
		m.File.Cleanup()
		out, err := m.File.Format()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(r.root, m.Dir, "go.mod"), out, 0o644); err != nil {
			return err
		}
		if err := dropRepoSums(filepath.Join(r.root, m.Dir, "go.sum")); err != nil {
			return err
		}
		fmt.Printf("release convert: %s requires the repository's modules at %s, no replace\n", m.Dir, v)
	}
	if err := r.syncWork(v); err != nil {
		return err
	}
	fmt.Printf("release convert: go.work uses every module and replaces each published one at %s by its directory\n", v)
	return nil
}

// dropRepoSums removes the repository's own modules from a go.sum: their
// hashes change with every commit of the tree, so no go.sum of the
// repository lists them (a user's go.sum gets them from the checksum
// database); tidy-check ignores them.
func dropRepoSums(file string) error {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var out []string
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if !isRepoSum(line) {
			out = append(out, line)
		}
	}
	return os.WriteFile(file, []byte(strings.Join(out, "")), 0o644)
}

func isRepoSum(line string) bool {
	mod, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	return mod == RepoModule || strings.HasPrefix(mod, RepoModule+"/")
}

// files lists what a module's zip holds: the working tree's files that git
// tracks or would track (not ignored), under the module's directory and not
// in a nested module, as a user would get them from the tag.
func (r *repo) files(m *Module) ([]modzip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", m.Dir)
	cmd.Dir = r.root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files %s: %w", m.Dir, err)
	}
	var files []modzip.File
	seen := map[string]bool{}
	for _, name := range strings.Split(string(out), "\x00") {
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		if r.owner(name) != m {
			continue
		}
		full := filepath.Join(r.root, filepath.FromSlash(name))
		info, err := os.Lstat(full)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil {
			return nil, err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		rel := name
		if m.Dir != "." {
			rel = strings.TrimPrefix(name, m.Dir+"/")
		}
		files = append(files, treeFile{rel: rel, full: full, info: info})
	}
	return files, nil
}

// owner is the innermost module holding a repository-relative file; a
// file of tools/ (the tool module) belongs to none.
func (r *repo) owner(name string) *Module {
	if name == "tools" || strings.HasPrefix(name, "tools/") {
		return nil
	}
	best := r.modules[0] // the core, "."
	for _, m := range r.modules[1:] {
		if strings.HasPrefix(name, m.Dir+"/") && (best.Dir == "." || len(m.Dir) > len(best.Dir)) {
			best = m
		}
	}
	return best
}

type treeFile struct {
	rel, full string
	info      os.FileInfo
}

func (f treeFile) Path() string                 { return f.rel }
func (f treeFile) Lstat() (os.FileInfo, error)  { return f.info, nil }
func (f treeFile) Open() (io.ReadCloser, error) { return os.Open(f.full) }

// writeProxy lays the published modules out as a GOPROXY serves them:
// $escaped/@v/list, $v.info, $v.mod and $v.zip.
func (r *repo) writeProxy(dir, v string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	stamp := time.Now().UTC().Truncate(time.Second)
	for _, m := range r.published() {
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return err
		}
		info, _ := json.Marshal(struct {
			Version string
			Time    time.Time
		}{v, stamp})
		gomod, err := os.ReadFile(filepath.Join(r.root, m.Dir, "go.mod"))
		if err != nil {
			return err
		}
		files, err := r.files(m)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := modzip.Create(&buf, module.Version{Path: m.Path, Version: v}, files); err != nil {
			return fmt.Errorf("zip of %s: %w", m.Dir, err)
		}
		for name, data := range map[string][]byte{"list": []byte(v + "\n"), v + ".info": info, v + ".mod": gomod, v + ".zip": buf.Bytes()} {
			if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// env is the environment of a go command that sees only the published
// modules, as a user would: no workspace, the repository's modules from the
// file proxy, everything else from the local module cache's download
// directory (laid out as a proxy) and then the usual proxy. The module
// cache is the rehearsal's own (the repository's modules at the
// development version change with the tree, and a module cache never
// refetches a version), with the repository's entries removed first.
type env struct {
	base, proxy, modcache string
}

func (r *repo) prepare() (*env, string, error) {
	v, err := r.version()
	if err != nil {
		return nil, "", err
	}
	base := filepath.Join(r.root, ".release")
	e := &env{base: base, proxy: filepath.Join(base, "proxy"), modcache: filepath.Join(base, "modcache")}
	for _, stale := range []string{
		filepath.Join(e.modcache, "github.com", "idemkit"),
		filepath.Join(e.modcache, "cache", "download", "github.com", "idemkit"),
	} {
		if err := os.RemoveAll(stale); err != nil {
			return nil, "", err
		}
	}
	if err := r.writeProxy(e.proxy, v); err != nil {
		return nil, "", err
	}
	return e, v, nil
}

func (e *env) vars() []string {
	userCache := strings.TrimSpace(goEnv("GOMODCACHE"))
	upstream := strings.TrimSpace(goEnv("GOPROXY"))
	if upstream == "" || upstream == "off" {
		upstream = "https://proxy.golang.org,direct"
	}
	proxy := "file://" + filepath.ToSlash(e.proxy)
	if userCache != "" {
		proxy += ",file://" + filepath.ToSlash(filepath.Join(userCache, "cache", "download"))
	}
	proxy += "," + upstream
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOWORK", "GOPROXY", "GOMODCACHE", "GOFLAGS", "GONOSUMDB", "GONOSUMCHECK", "GOPRIVATE", "GONOPROXY", "GOSUMDB", "GOBIN":
			continue
		}
		out = append(out, kv)
	}
	return append(out,
		"GOWORK=off",
		"GOPROXY="+proxy,
		"GOMODCACHE="+e.modcache,
		// The checksum database knows no rehearsal's hash of the
		// repository's modules; the others were checked when they entered
		// the local module cache and are checked against each go.sum.
		"GONOSUMDB="+RepoModule,
		"GOSUMDB=off",
		// -modcacherw: the next run can remove the repository's entries;
		// -trimpath: builds from this module cache share the build cache
		// from one clone to the next.
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
	)
}

func goEnv(name string) string {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func (e *env) run(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Env = dir, e.vars()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, out)
	}
	return out, nil
}

// tidyCheck runs go mod tidy -diff in every module with the repository's
// modules served by the proxy. The repository's own go.sum lines are left
// out of every go.sum (see dropRepoSums), so a diff adding them is not
// untidiness; any other difference is.
func (r *repo) tidyCheck() error {
	e, v, err := r.prepare()
	if err != nil {
		return err
	}
	dirs := []string{"tools"}
	for _, m := range r.modules {
		dirs = append(dirs, m.Dir)
	}
	var bad []string
	for _, d := range dirs {
		fmt.Printf("go mod tidy -diff (%s, the repository's modules at %s from the rehearsal proxy)\n", d, v)
		out, err := e.run(filepath.Join(r.root, d), "mod", "tidy", "-diff")
		if err == nil {
			continue
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return err
		}
		if rest := untidy(string(out)); rest != "" {
			bad = append(bad, d+":\n"+rest)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("not tidy (run go mod tidy there, then release convert):\n%s", strings.Join(bad, "\n"))
	}
	return nil
}

// tidy runs go mod tidy in the named module directories against the
// rehearsal proxy, then drops the repository's own go.sum lines.
func (r *repo) tidy(dirs []string) error {
	e, _, err := r.prepare()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if _, err := e.run(filepath.Join(r.root, d), "mod", "tidy"); err != nil {
			return err
		}
		if err := dropRepoSums(filepath.Join(r.root, d, "go.sum")); err != nil {
			return err
		}
	}
	return nil
}

// untidy is what a tidy -diff reports besides the repository's go.sum
// lines; a failure without a diff (a resolution error) is returned whole.
func untidy(diff string) string {
	var rest []string
	sawDiff := false
	for _, line := range strings.Split(diff, "\n") {
		if strings.HasPrefix(line, "+++") || strings.HasPrefix(line, "---") || strings.HasPrefix(line, "diff ") {
			sawDiff = true
			continue
		}
		if (strings.HasPrefix(line, "+") || strings.HasPrefix(line, "-")) && !isRepoSum(line[1:]) {
			rest = append(rest, line)
		}
	}
	if !sawDiff {
		return diff
	}
	return strings.Join(rest, "\n")
}

// rehearse proves the published modules install and build as a user gets
// them: (a) go install of every program of a published module at the
// development version, each of cmd/ answering --help; (b) a module outside
// the tree that go-gets every library module and builds a program
// importing each of their public packages.
func (r *repo) rehearse() error {
	if err := r.check(); err != nil {
		return err
	}
	start := time.Now()
	e, v, err := r.prepare()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "idem-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "bin")

	var programs, libraries []string
	var libModules []*Module
	for _, m := range r.published() {
		pkgs, err := r.packages(m)
		if err != nil {
			return err
		}
		lib := !(m.Dir == "cmd" || strings.HasPrefix(m.Dir, "cmd/") || strings.HasPrefix(m.Dir, "examples/"))
		for _, p := range pkgs {
			switch {
			case p.main && !p.internal:
				programs = append(programs, p.path)
			case lib && !p.main && !p.internal:
				libraries = append(libraries, p.path)
			}
		}
		if lib {
			libModules = append(libModules, m)
		}
	}
	// One go install per module: its programs build together, sharing
	// their dependencies' compilation.
	byModule := map[string][]string{}
	var order []string
	for _, p := range programs {
		m := r.moduleOf(p)
		if _, ok := byModule[m]; !ok {
			order = append(order, m)
		}
		byModule[m] = append(byModule[m], p+"@"+v)
	}
	for _, m := range order {
		fmt.Printf("go install %s\n", strings.Join(byModule[m], " "))
		cmd := exec.Command("go", append([]string{"install"}, byModule[m]...)...)
		cmd.Dir, cmd.Env = work, append(e.vars(), "GOBIN="+bin)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go install %s: %w\n%s", strings.Join(byModule[m], " "), err, out)
		}
	}
	for _, p := range programs {
		if !strings.HasPrefix(p, RepoModule+"/cmd/") {
			continue
		}
		exe := filepath.Join(bin, path.Base(p))
		out, err := exec.Command(exe, "--help").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s --help: %w\n%s", exe, err, out)
		}
		if !strings.Contains(strings.ToLower(string(out)), "usage") {
			return fmt.Errorf("%s --help printed no usage:\n%s", exe, out)
		}
		fmt.Printf("%s --help: exit 0\n", path.Base(p))
	}

	consumer := filepath.Join(work, "consumer")
	if err := os.MkdirAll(consumer, 0o755); err != nil {
		return err
	}
	if _, err := e.run(consumer, "mod", "init", "example.com/idemconsumer"); err != nil {
		return err
	}
	get := []string{"get"}
	for _, m := range libModules {
		get = append(get, m.Path+"@"+v)
	}
	fmt.Printf("go %s (a fresh module outside the tree)\n", strings.Join(get, " "))
	if _, err := e.run(consumer, get...); err != nil {
		return err
	}
	var src strings.Builder
	src.WriteString("// Command idemconsumer imports every public package of idem's libraries.\npackage main\n\nimport (\n")
	for _, p := range libraries {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	src.WriteString(")\n\nfunc main() {}\n")
	if err := os.WriteFile(filepath.Join(consumer, "main.go"), []byte(src.String()), 0o644); err != nil {
		return err
	}
	if _, err := e.run(consumer, "mod", "tidy"); err != nil {
		return err
	}
	if _, err := e.run(consumer, "build", "-o", filepath.Join(bin, "idemconsumer"), "."); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(consumer, "go.mod"))
	if err != nil {
		return err
	}
	for _, m := range libModules {
		if !bytes.Contains(gomod, []byte(m.Path+" "+v)) {
			return fmt.Errorf("the consumer's go.mod does not require %s %s:\n%s", m.Path, v, gomod)
		}
	}
	fmt.Printf("release rehearse: %d programs installed, a consumer of %d packages of %d modules built at %s (%s)\n",
		len(programs), len(libraries), len(libModules), v, time.Since(start).Round(time.Second))
	return nil
}

// moduleOf is the path of the innermost published module holding an import path.
func (r *repo) moduleOf(importPath string) string {
	best := ""
	for _, m := range r.published() {
		if (importPath == m.Path || strings.HasPrefix(importPath, m.Path+"/")) && len(m.Path) > len(best) {
			best = m.Path
		}
	}
	return best
}

type pkg struct {
	path           string
	main, internal bool
}

// packages lists a module's packages: directories with a non-test Go file.
func (r *repo) packages(m *Module) ([]pkg, error) {
	files, err := r.files(m)
	if err != nil {
		return nil, err
	}
	byDir := map[string]string{}
	for _, f := range files {
		name := f.Path()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		dir := path.Dir(name)
		if strings.Contains("/"+dir+"/", "/testdata/") {
			continue
		}
		if _, ok := byDir[dir]; ok {
			continue
		}
		pf, err := parser.ParseFile(token.NewFileSet(), f.(treeFile).full, nil, parser.PackageClauseOnly)
		if err != nil {
			return nil, err
		}
		byDir[dir] = pf.Name.Name
	}
	var out []pkg
	for dir, name := range byDir {
		p := m.Path
		if dir != "." {
			p += "/" + dir
		}
		out = append(out, pkg{path: p, main: name == "main", internal: strings.Contains("/"+dir+"/", "/internal/")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, nil
}
