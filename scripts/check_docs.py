"""The docs' C++ is compiled: every ```cpp block of README.md and docs/**/*.md is built by ctest, and
run when it is a program.

Why this way. A block that no compiler sees drifts: an API is renamed, a field moves, a name is never
declared, and nothing fails. So each block is one of these kinds, and none is left unchecked:

* a copy of a file: its first line is `// examples/<path>`. It must equal that file, which the
  examples build or a unit test compiles (and the tests train the policies defined there).
* a program (a line starts `int main`): a translation unit of its own, exactly as printed (its own
  #includes), one executable per program (few: a main of their own keeps them copyable as they are),
  run by ctest as `docs.run.<doc>:<line>`. `args="..."` gives its command line, `expect="<regex>"` what
  its output must contain; it must exit 0. A doc program trains on a tiny config written in the doc.
* a fragment (anything else: declarations, or statements given a context): compiled and linked, not
  run. ALL fragments go into ONE translation unit, each in a namespace of its own (`snippet_<doc>_<line>`):
  LibTorch and fulgur are parsed once, a Trainer that several blocks instantiate the same way is
  instantiated once, and the unit tests' precompiled header and -O1 are reused (every TU that
  includes <torch/torch.h> costs 10-20 s on the 2-core CI). Fragments see <fulgur/fulgur.hpp> and
  <torch/torch.h> without including them, as a reader of a doc does, and may leave variables unused.
  The unit is linked into an executable that is never run, so calling something declared and never
  defined fails as well.
* a compile-fail block, `<!-- snippet: compile-fail "message" -->`: an example of an error. It must
  fail with exactly one error containing the message, and without the block (its twin) the unit
  must compile: cmake/FulgurCompileFail.cmake, the machinery of the library's compile-fail tests.
* skipped, `<!-- snippet: skip (reason) -->`, only where compiling is impossible: listed with its
  reason and counted apart, never as passed.

A context is what a block needs that a reader does not see: a module and loaders, a function body
around statements, a struct around members. It is named in an HTML comment on the line right before
the fence, `<!-- snippet: context=fit -->`, and is the file tests/docs/contexts/<name>.hpp, whose line
`// @block` is where the block goes (the lines before it are prepended, the lines after appended).
`// @needs bench` in a context links Google Benchmark and adds bench/ to the include path.
`#line` directives make every diagnostic name the .md file and its line (or the context file's).

Extraction runs at configure time (`check_docs.py generate <dir>`, from tests/docs/CMakeLists.txt):
the .md files, the contexts and this script are CMAKE_CONFIGURE_DEPENDS, so an edited doc is
extracted again by the next build, and a file is rewritten only when its text changed (no needless
rebuild). Nothing generated is committed. The targets are not part of `all`: the test docs.build
builds them (`check_docs.py build`), names the doc and block of every error, and is the fixture of
the programs' runs. `check_docs.py` without arguments is the test docs.snippets: copies equal their
files, every fence names its language, every cpp block has a well-formed kind (known marker, existing
context), a policy is defined only in an examples/ file; it prints the count of each kind and every
skipped block with its reason.
"""
import json
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONTEXTS = ROOT / "tests" / "docs" / "contexts"
POLICY = re.compile(r"(:\s*(public\s+)?fulgur::(strategy_defaults|accelerator_defaults|FloatPrecision|DoublePrecision|"
                    r"FP16MixedPrecision|BF16MixedPrecision|FP16TruePrecision|BF16TruePrecision|SingleDeviceStrategy|"
                    r"DDPStrategy|CPUAccelerator|CUDAAccelerator))|static constexpr std::string_view name =")
MARKER = re.compile(r"^\s*<!--\s*snippet:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(.*)$")  # indented too (a fence in a list item)
# Languages a fence may name: cpp is compiled; the others are not C++.
NOT_CPP = {"sh", "bash", "console", "cmake", "text", "python", "yaml", "json", "toml", "ini", "diff", "csv"}
CPP_LIKE = {"c++", "cxx", "cc", "hpp", "h", "c", "cuda"}
KEYS = {"context", "args", "expect", "compile-fail"}


def docs():
    return sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md")])


def slug(doc, line):
    """docs/concepts/strategy.md, 111 -> concepts_strategy_md_111 (README.md, 10 -> README_md_10)."""
    return re.sub(r"[^A-Za-z0-9]", "_", f"{doc.removeprefix('docs/')}_{line}")


class Block:
    """A ```cpp block: where it is, its text, the marker before it and what it is."""

    def __init__(self, doc, fence_line, lines, marker):
        self.doc, self.fence_line, self.lines, self.marker = doc, fence_line, lines, marker
        self.first_line, self.last_line = fence_line + 1, fence_line + len(lines)
        self.where = f"{doc}:{fence_line}"
        self.id = slug(doc, fence_line)
        self.options, self.skip, self.problems = {}, None, []
        self.parse_marker()
        self.kind = self.classify()

    def parse_marker(self):
        if self.marker is None:
            return
        text = self.marker.strip()
        if text.startswith("skip"):
            reason = re.fullmatch(r"skip\s*\((.+)\)", text)
            if reason is None or not reason.group(1).strip():
                self.problems.append(f"{self.where}: `skip` needs its reason: <!-- snippet: skip (why it cannot compile) -->")
            else:
                self.skip = reason.group(1).strip()
            return
        try:
            words = shlex.split(text)
        except ValueError as error:
            self.problems.append(f"{self.where}: bad snippet marker ({error}): {text}")
            return
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            if word == "compile-fail":
                if i >= len(words) or "=" in words[i] and words[i].split("=")[0] in KEYS:
                    self.problems.append(f'{self.where}: compile-fail needs the expected message: compile-fail "text"')
                else:
                    self.options["compile-fail"] = words[i]
                    i += 1
                continue
            key, eq, value = word.partition("=")
            if not eq or key not in KEYS - {"compile-fail"}:
                self.problems.append(f"{self.where}: unknown snippet option `{word}` (known: context=, args=, expect=, "
                                     f'compile-fail "message", skip (reason))')
                continue
            self.options[key] = value

    def classify(self):
        text = "\n".join(self.lines)
        if self.lines and self.lines[0].startswith("// examples/"):
            if self.marker is not None:
                self.problems.append(f"{self.where}: a copy of an examples/ file takes no snippet marker")
            return "copy"
        if self.skip is not None:
            return "skipped"
        program = re.search(r"^int main\s*\(", text, re.M) is not None
        if "compile-fail" in self.options:
            message = self.options["compile-fail"]
            if program:
                self.problems.append(f"{self.where}: a compile-fail block cannot be a program")
            if not message.strip() or any(c in message for c in ';"$\\'):
                self.problems.append(f"{self.where}: the compile-fail message must be non-empty text without ; \" $ or \\ "
                                     "(CMake passes it on): quote the part of the message before such a character")
            return "compile-fail"
        if not program and ("args" in self.options or "expect" in self.options):
            self.problems.append(f"{self.where}: args= and expect= are for programs (blocks with int main)")
        if "expect" in self.options:
            try:
                re.compile(self.options["expect"])
            except re.error as error:
                self.problems.append(f"{self.where}: expect= is not a regular expression: {error}")
        return "program" if program else "fragment"

    def context(self):
        """(prefix lines, suffix lines, needs) of the block's context; problems when it is bad."""
        name = self.options.get("context")
        if name is None:
            return [], [], set(), None
        path = CONTEXTS / f"{name}.hpp"
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name) or not path.exists():
            return None, None, None, f"{self.where}: context `{name}` does not exist (tests/docs/contexts/{name}.hpp)"
        lines = path.read_text().splitlines()
        marks = [i for i, line in enumerate(lines) if line.strip() == "// @block"]
        if len(marks) != 1:
            return None, None, None, f"{self.where}: tests/docs/contexts/{name}.hpp must have one `// @block` line"
        needs = {m.group(1) for line in lines for m in [re.match(r"\s*// @needs (\w+)", line)] if m}
        return lines[:marks[0]], lines[marks[0] + 1:], needs, None


def scan(doc_path):
    """The doc's ```cpp blocks, and problems with its fences and markers."""
    doc = doc_path.relative_to(ROOT).as_posix()
    lines = doc_path.read_text().splitlines()
    blocks, problems = [], []
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if marker and not (i + 1 < len(lines) and lines[i + 1].strip() == "```cpp"):
            problems.append(f"{doc}:{i + 1}: a snippet marker must be on the line right before a ```cpp fence")
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language = fence.group(1), fence.group(2).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), None)
        if end is None:
            problems.append(f"{doc}:{i + 1}: a fence that is never closed")
            break
        if language == "":
            problems.append(f"{doc}:{i + 1}: a fence without a language: name it (```cpp is compiled; ```text, "
                            "```sh, ... are not C++)")
        elif language.lower() in CPP_LIKE:
            problems.append(f"{doc}:{i + 1}: ```{language}: C++ is fenced ```cpp, so that it is compiled")
        elif language == "cpp":
            prev = MARKER.match(lines[i - 1]) if i > 0 else None
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end]]
            blocks.append(Block(doc, i + 1, body, prev.group(1) if prev else None))
        elif language not in NOT_CPP:
            problems.append(f"{doc}:{i + 1}: ```{language}: unknown fence language (known: cpp, "
                            + ", ".join(sorted(NOT_CPP)) + ")")
        i = end + 1
    return blocks, problems


def all_blocks():
    blocks, problems = [], []
    for doc in docs():
        found, bad = scan(doc)
        blocks += found
        problems += bad
    return blocks, problems


# ---- docs.snippets -------------------------------------------------------------------------------
def check():
    blocks, problems = all_blocks()
    counts = {"copy": 0, "program": 0, "fragment": 0, "compile-fail": 0, "skipped": 0}
    skipped = []
    for block in blocks:
        problems += block.problems
        counts[block.kind] += 1
        text = "\n".join(block.lines) + "\n"
        if block.kind == "copy":
            source = ROOT / block.lines[0][3:].strip()
            if not source.exists():
                problems.append(f"{block.where}: {source.relative_to(ROOT)} does not exist")
            elif source.read_text() != text:
                problems.append(f"{block.where}: the block differs from {source.relative_to(ROOT)}")
            continue
        if block.kind == "skipped":
            skipped.append(f"  skipped {block.where}: {block.skip}")
        elif POLICY.search(text) and block.kind != "compile-fail":
            problems.append(f"{block.where}: a policy is defined in a doc block: copy it into examples/extending/ "
                            "(where the tests train it) and include it as `// examples/...`:\n"
                            + "\n".join("    " + line for line in block.lines[:4]))
        if block.kind != "skipped":
            error = block.context()[3]
            if error:
                problems.append(error)
    for problem in problems:
        print(problem)
    for line in skipped:
        print(line)
    print(f"{len(blocks)} cpp blocks: {counts['fragment']} fragments (compiled by docs.build), {counts['program']} "
          f"programs (compiled by docs.build, run by docs.run.*), {counts['compile-fail']} compile-fail "
          f"(compile_fail.docs_*), {counts['copy']} copies equal to their examples/ file, {counts['skipped']} skipped")
    print(f"{len(blocks) - counts['skipped']} checked, {len(problems)} problems")
    return 1 if problems or not blocks else 0


# ---- generate: the translation units, the CMake calls and the manifest ---------------------------
def line_directive(line, path):
    return f'#line {line} "{path}"'


def block_body(block, hoist):
    """The block's lines after a #line; with hoist, #include lines become blank (they go to the top)."""
    out = [line_directive(block.first_line, block.doc)]
    for line in block.lines:
        out.append("" if hoist and line.lstrip().startswith("#include") else line)
    return out


def with_context(block, body):
    prefix, suffix, _, _ = block.context()
    name = block.options.get("context")
    out = []
    if prefix:
        out += [line_directive(1, f"tests/docs/contexts/{name}.hpp"), *prefix]
    out += body
    if suffix:
        out += [line_directive(len(prefix) + 2, f"tests/docs/contexts/{name}.hpp"), *suffix]
    return out


GENERATED = "// Generated from the docs by scripts/check_docs.py at configure time: do not edit; edit the .md."


def fragments_unit(blocks):
    out = [GENERATED, "#include <fulgur/fulgur.hpp>", "#include <torch/torch.h>", "", '#include "support.hpp"', ""]
    # A fragment's own #includes, hoisted out of its namespace (each with the doc's line).
    for block in blocks:
        for offset, line in enumerate(block.lines):
            if line.lstrip().startswith("#include"):
                out += [line_directive(block.first_line + offset, block.doc), line]
    out += ["", "// Fragments may leave a variable unused, as a doc does to show a type or a call.",
            "#pragma GCC diagnostic push", '#pragma GCC diagnostic ignored "-Wunused-variable"',
            '#pragma GCC diagnostic ignored "-Wunused-but-set-variable"',
            '#pragma GCC diagnostic ignored "-Wunused-parameter"', ""]
    for block in blocks:
        out += [f"// ---- {block.where} ----", f"namespace snippet_{block.id} {{"]
        out += with_context(block, block_body(block, hoist=True))
        out += [f"}}  // namespace snippet_{block.id}", ""]
    out += ["#pragma GCC diagnostic pop", "",
            "// Never run: the fragments are compiled and linked, and the programs are the ones that run.",
            "int main() { return 0; }", ""]
    return "\n".join(out)


def program_unit(block):
    return "\n".join([GENERATED, *with_context(block, block_body(block, hoist=False)), ""])


def compile_fail_unit(block):
    # The block (with its context) only under FULGUR_COMPILE_FAIL: the twin is the context alone.
    prefix, suffix, _, _ = block.context()
    name = block.options.get("context")
    out = [GENERATED, "#include <fulgur/fulgur.hpp>", "#include <torch/torch.h>", "", '#include "support.hpp"', ""]
    if prefix:
        out += [line_directive(1, f"tests/docs/contexts/{name}.hpp"), *prefix]
    out += ["#ifdef FULGUR_COMPILE_FAIL", *block_body(block, hoist=False), "#endif"]
    if suffix:
        out += [line_directive(len(prefix) + 2, f"tests/docs/contexts/{name}.hpp"), *suffix]
    return "\n".join(out + [""])


def write_if_changed(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def cmake_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def generate(out_dir):
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks, _ = all_blocks()
    # A block with a problem is left out; docs.snippets reports it.
    usable = [b for b in blocks if not b.problems and b.kind != "copy" and b.kind != "skipped" and not b.context()[3]]
    fragments = [b for b in usable if b.kind == "fragment"]
    cmake = ["# Generated by scripts/check_docs.py generate: the docs' blocks (tests/docs/CMakeLists.txt)."]
    manifest = []
    files = set()
    path = out_dir / "fragments.cpp"
    write_if_changed(path, fragments_unit(fragments))
    files.add(path.name)
    cmake.append(f"fulgur_docs_fragments({cmake_string(str(path))})")
    for block in fragments:
        manifest.append({"id": block.id, "doc": block.doc, "fence": block.fence_line, "first": block.first_line,
                         "last": block.last_line, "kind": "fragment"})
    for block in usable:
        entry = {"id": block.id, "doc": block.doc, "fence": block.fence_line, "first": block.first_line,
                 "last": block.last_line, "kind": block.kind}
        if block.kind == "program":
            path = out_dir / f"{block.id}.cpp"
            write_if_changed(path, program_unit(block))
            needs = sorted(block.context()[2])
            entry.update(args=shlex.split(block.options.get("args", "")), expect=block.options.get("expect"))
            cmake.append(f"fulgur_docs_program({block.id} {cmake_string(str(path))} {cmake_string(block.where)} "
                         f"NEEDS {' '.join(needs)})")
        elif block.kind == "compile-fail":
            path = out_dir / f"{block.id}.cpp"
            write_if_changed(path, compile_fail_unit(block))
            cmake.append(f"fulgur_docs_compile_fail({block.id} {cmake_string(str(path))} "
                         f"{cmake_string(block.options['compile-fail'])})")
        else:
            continue
        files.add(path.name)
        manifest.append(entry)
    for stale in out_dir.glob("*.cpp"):
        if stale.name not in files:
            stale.unlink()
    write_if_changed(out_dir / "snippets.cmake", "\n".join(cmake) + "\n")
    write_if_changed(out_dir / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return 0


# ---- docs.build: build the docs' targets; name the block of each error ----------------------------
def build(build_dir, manifest_path, *targets):
    manifest = json.loads(pathlib.Path(manifest_path).read_text())
    command = ["cmake", "--build", build_dir, "--parallel", "2", "--target", *targets]
    print(" ".join(command), flush=True)
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(run.stdout)
    if run.returncode == 0:
        print(f"docs built: {' '.join(targets)}")
        return 0
    # Each block that a diagnostic names: an error in it, or an instantiation "required from" it
    # (then the error is the next one GCC prints, in a header).
    location = re.compile(r"^((?:README|docs/\S*?)\.md|tests/docs/contexts/\S+?):(\d+):(?:\d+:)?\s*(.*)$")
    named, waiting = {}, []
    for text in run.stdout.splitlines():
        m = location.match(text)
        if m and re.match(r"(fatal )?error:|required from", m.group(3)):
            doc, line = m.group(1), int(m.group(2))
            block = next((b for b in manifest if b["doc"] == doc and b["first"] <= line <= b["last"]), None)
            where = f"{doc}:{block['fence']}" if block else f"{doc}:{line}"
            if where not in named:
                named[where] = f"{doc}:{line}: {m.group(3)}"
                if not m.group(3).startswith(("error:", "fatal error:")):
                    waiting.append(where)
        elif " error: " in text and waiting:
            for where in waiting:
                named[where] += f"; {text.strip()}"
            waiting = []
    for where, first in named.items():
        print(f"docs: the block at {where} does not compile: {first}")
    if not named:
        print("docs: the build failed outside the blocks (see above)")
    return 1


# ---- docs.run.<doc>:<line>: a program, its exit status and its output ----------------------------
def run(manifest_path, block_id, executable):
    manifest = json.loads(pathlib.Path(manifest_path).read_text())
    block = next(b for b in manifest if b["id"] == block_id)
    where = f"{block['doc']}:{block['fence']}"
    result = subprocess.run([executable, *block["args"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(result.stdout)
    if result.returncode != 0:
        print(f"docs: the program at {where} exited with status {result.returncode}")
        return 1
    if block["expect"] and not re.search(block["expect"], result.stdout):
        print(f"docs: the output of the program at {where} does not match expect=\"{block['expect']}\"")
        return 1
    print(f"docs: the program at {where} ran" + (f" and printed what expect=\"{block['expect']}\" asks"
                                                  if block["expect"] else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 1:
        sys.exit(check())
    mode, args = sys.argv[1], sys.argv[2:]
    sys.exit({"generate": generate, "build": build, "run": run}[mode](*args))
