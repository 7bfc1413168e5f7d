"""docs.snippets: code in the docs that defines a user policy must be code that compiles.

A ```cpp block whose first line is `// examples/...` must equal that file (which a ctest compiles).
Any other ```cpp block that defines a policy (derives from a fulgur policy or defaults base, or
declares a policy's `name`) is an error: copy it into examples/extending/ and include it.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
POLICY = re.compile(r"(:\s*(public\s+)?fulgur::(strategy_defaults|accelerator_defaults|FloatPrecision|DoublePrecision|"
                    r"FP16MixedPrecision|BF16MixedPrecision|FP16TruePrecision|BF16TruePrecision|SingleDeviceStrategy|"
                    r"DDPStrategy|CPUAccelerator|CUDAAccelerator))|static constexpr std::string_view name =")


def blocks(text):
    return re.findall(r"^```cpp\n(.*?)^```", text, re.M | re.S)


def main():
    problems, checked = [], 0
    for doc in sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md")]):
        for block in blocks(doc.read_text()):
            first = block.splitlines()[0] if block.strip() else ""
            if first.startswith("// examples/"):
                source = ROOT / first[3:].strip()
                checked += 1
                if not source.exists():
                    problems.append(f"{doc.relative_to(ROOT)}: {source.relative_to(ROOT)} does not exist")
                elif source.read_text() != block:
                    problems.append(f"{doc.relative_to(ROOT)}: the block differs from {source.relative_to(ROOT)}")
            elif POLICY.search(block):
                problems.append(f"{doc.relative_to(ROOT)}: a policy is defined in a block no test compiles:\n"
                                + "\n".join("    " + line for line in block.splitlines()[:4]))
    for problem in problems:
        print(problem)
    print(f"{checked} included snippets checked, {len(problems)} problems")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
