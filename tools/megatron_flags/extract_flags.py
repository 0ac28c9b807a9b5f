#!/usr/bin/env python3
"""Extract the command-line flags of Megatron-LM's, MindSpeed's and MindSpeed-LLM's argument
parsers from a git checkout, without importing them (no torch needed).

    tools/megatron_flags/extract_flags.py \
        --megatron MEGATRON_GIT_DIR --mindspeed MINDSPEED_GIT_DIR \
        --mindspeed-llm MINDSPEED_LLM_GIT_DIR > tools/megatron_flags/flags.txt

Each GIT_DIR is a git directory (a bare mirror works); the commit read is its HEAD and is written
into the output header, so the list says what it was extracted from. Output: one line per flag,
"SOURCE --flag", sorted and without duplicates (a flag registered by two projects is listed once
per project). memsim's classification table (src/config/megatron_flags.cc) must cover every flag
of the file exactly once (tests/config/megatron_flags_test.cc).

How the flags are found (static reading with Python's ast module):
  1. Every call `<anything>.add_argument("--a", "--b", ...)` in the parser sources: each string
     literal starting with "--" is a flag. Megatron-LM: megatron/training/arguments.py;
     MindSpeed: every .py under mindspeed/; MindSpeed-LLM: every .py under mindspeed_llm/.
  2. Megatron-LM also generates flags from config dataclasses: every call
     `ArgumentGroupFactory(Cls, exclude=[...])` in arguments.py adds one flag per dataclass
     field of Cls (its bases first), as megatron/training/argument_utils.py
     (ArgumentGroupFactory._build_argparse_kwargs_from_field) names them: "--field-name"; a bool
     field whose default is True becomes "--no-field-name" and "--disable-field-name"; a field
     with metadata {"argparse_meta": {"arg_names": [...]}} takes those names; fields in
     `exclude` (a literal list, or a name bound to one earlier in the same function) and fields
     with init=False are skipped.
What this misses: flags whose names are computed at run time (not string literals). Those, when
met in a script, are reported by memsim as unknown flags (a warning), never dropped silently.
"""

import argparse
import ast
import subprocess
import sys


def git(git_dir, *args):
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                          capture_output=True, text=True).stdout


def read(git_dir, path):
    return git(git_dir, "show", "HEAD:" + path)


def python_files(git_dir, folder):
    names = git(git_dir, "ls-tree", "-r", "--name-only", "HEAD", "--", folder).split("\n")
    return sorted(n for n in names if n.endswith(".py"))


def add_argument_flags(tree):
    flags = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) \
                        and a.value.startswith("--"):
                    flags.add(a.value)
    return flags


def literal_list(node, scope):
    """The strings of a list literal, or of a name bound to one in `scope` (a function body)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    if isinstance(node, ast.Name) and scope is not None:
        for stmt in ast.walk(scope):
            if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets):
                return literal_list(stmt.value, None)
    return []


class ClassIndex:
    """Finds dataclass definitions by name in the megatron/ package of a git directory."""

    def __init__(self, git_dir):
        self.classes = {}
        for path in python_files(git_dir, "megatron"):
            try:
                tree = ast.parse(read(git_dir, path))
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)

    def fields(self, name):
        cls = self.classes.get(name)
        if cls is None:
            raise SystemExit(f"extract_flags: dataclass {name} not found")
        out = []
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.classes:
                out.extend(self.fields(base.id))
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out = [f for f in out if f[0] != stmt.target.id]
                out.append((stmt.target.id, stmt.annotation, stmt.value))
        return out


def field_call_keywords(value):
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        return {k.arg: k.value for k in value.keywords}
    return {}


def dataclass_flags(name, annotation, value):
    kw = field_call_keywords(value)
    if "init" in kw and isinstance(kw["init"], ast.Constant) and kw["init"].value is False:
        return []
    meta = kw.get("metadata")
    if isinstance(meta, ast.Dict):
        for k, v in zip(meta.keys, meta.values):
            if isinstance(k, ast.Constant) and k.value == "argparse_meta" and isinstance(v, ast.Dict):
                for k2, v2 in zip(v.keys, v.values):
                    if isinstance(k2, ast.Constant) and k2.value == "arg_names":
                        return literal_list(v2, None)
    default = kw.get("default", value if not kw else None)
    is_bool = isinstance(annotation, ast.Name) and annotation.id == "bool"
    dashed = name.replace("_", "-")
    if is_bool and isinstance(default, ast.Constant) and default.value is True:
        return ["--no-" + dashed, "--disable-" + dashed]
    return ["--" + dashed]


def megatron_flags(git_dir):
    tree = ast.parse(read(git_dir, "megatron/training/arguments.py"))
    flags = add_argument_flags(tree)
    index = ClassIndex(git_dir)
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        for node in ast.walk(func):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "ArgumentGroupFactory" and node.args
                    and isinstance(node.args[0], ast.Name)):
                exclude = set()
                for k in node.keywords:
                    if k.arg == "exclude":
                        exclude = set(literal_list(k.value, func))
                for fname, ann, value in index.fields(node.args[0].id):
                    if fname not in exclude:
                        flags.update(dataclass_flags(fname, ann, value))
    return flags


def package_flags(git_dir, folder):
    flags = set()
    for path in python_files(git_dir, folder):
        try:
            flags |= add_argument_flags(ast.parse(read(git_dir, path)))
        except SyntaxError:
            continue
    return flags


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True)
    p.add_argument("--mindspeed", required=True)
    p.add_argument("--mindspeed-llm", required=True)
    a = p.parse_args()
    sources = [
        ("megatron-lm", "NVIDIA/Megatron-LM", a.megatron, lambda d: megatron_flags(d)),
        ("mindspeed", "Ascend/MindSpeed", a.mindspeed, lambda d: package_flags(d, "mindspeed")),
        ("mindspeed-llm", "Ascend/MindSpeed-LLM", a.mindspeed_llm,
         lambda d: package_flags(d, "mindspeed_llm")),
    ]
    print("# Flags of the Megatron-LM, MindSpeed and MindSpeed-LLM argument parsers,")
    print("# written by tools/megatron_flags/extract_flags.py (its docstring says how). Sources:")
    lines = []
    for label, repo, git_dir, extract in sources:
        commit = git(git_dir, "rev-parse", "HEAD").strip()
        print(f"#   {label}: github.com/{repo} at {commit}")
        lines += [f"{label} {f}" for f in extract(git_dir)]
    for line in sorted(set(lines)):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
