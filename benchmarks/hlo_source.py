"""Which source lines an optimized HLO module's instructions come from (the profilers' kernel
attribution).

``jax.jit(f).lower(...).compile().as_text()`` prints the optimized module: every instruction
with ``metadata={op_name="jit(f)/..." ...}`` and either ``source_file="..." source_line=N`` or
``stack_frame_id=K``, the latter indexing the module's ``FileNames`` / ``FunctionNames`` /
``FileLocations`` / ``StackFrames`` tables (printed before the computations). A fusion's fused
computation holds its fused instructions with their own metadata. :func:`parse_hlo` reads that
text into an :class:`HloIndex`, which maps an instruction name (what a GPU trace's ``hlo_op``
names) or a kernel name (XLA names a fusion's kernel after the instruction, ``.`` and ``-``
replaced by ``_``) to the op name and the source line (the innermost stack frame in this
repository, else the innermost frame).

A small parser of our own (jaxlib exposes no metadata accessors); it keeps what it cannot read
out rather than failing: unknown lines are skipped, an instruction without metadata has no
source.
"""

import collections
import dataclasses
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Opcodes that never explain a kernel's time (inside a fused computation).
TRIVIAL_OPCODES = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                             "iota"})

_MODULE_RE = re.compile(r"^HloModule\s+([^\s,]+)")
_COMPUTATION_RE = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*(\(.*)?\{\s*$")
_INSTRUCTION_RE = re.compile(r"^\s+(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*?)\s([a-z][a-z0-9_\-]*)\(")
_CALLS_RE = re.compile(r"\bcalls=(\{[^}]*\}|%?[^\s,)]+)")
_KV_RE = re.compile(r'([A-Za-z_]\w*)=("(?:[^"\\]|\\.)*"|[^\s}]+)')
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


@dataclasses.dataclass(frozen=True)
class Frame:
    """One source position: ``file`` as printed in the HLO, 1-based ``line``, ``function``."""
    file: str
    line: int
    function: str = ""


@dataclasses.dataclass
class Instruction:
    """One HLO instruction: ``name`` (e.g. ``fusion.3``), ``opcode``, the ``computation`` it is in,
    ``op_name`` (``""`` without metadata), ``frames`` (innermost first; empty without a source),
    ``calls`` (computations it calls with ``calls=``: a fusion's fused computation),
    ``deduplicated_name`` (metadata's, ``""`` if absent) and ``is_root``."""
    name: str
    opcode: str
    computation: str
    op_name: str = ""
    frames: Tuple[Frame, ...] = ()
    calls: Tuple[str, ...] = ()
    deduplicated_name: str = ""
    is_root: bool = False


def sanitize(name: str) -> str:
    """``name`` as XLA names a kernel after an instruction: characters other than letters,
    digits and ``_`` become ``_`` (``loop_multiply_fusion.44`` -> ``loop_multiply_fusion_44``)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def short_path(path: str, root: str = ROOT) -> str:
    """``path`` relative to the repository ``root`` when under it; a path under
    ``site-packages/`` from there; else ``path`` unchanged."""
    norm = os.path.normpath(path)
    root = os.path.normpath(root)
    if norm.startswith(root + os.sep):
        return os.path.relpath(norm, root)
    marker = os.sep + "site-packages" + os.sep
    if marker in norm:
        return norm.split(marker, 1)[1]
    return path


def op_tail(op_name: str, parts: int = 2) -> str:
    """The last ``parts`` ``/``-separated components of an op name
    (``jit(step)/jvp(f)/concatenate`` -> ``jvp(f)/concatenate`` for 2)."""
    return "/".join(op_name.split("/")[-parts:]) if op_name else ""


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _metadata(line: str) -> Dict[str, str]:
    """The ``metadata={...}`` key/values of an instruction line (quotes removed); ``{}`` if none."""
    start = line.find("metadata={")
    if start < 0:
        return {}
    i, quoted, body_start = start + len("metadata={"), False, start + len("metadata={")
    while i < len(line):
        c = line[i]
        if c == "\\" and quoted:
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            break
        i += 1
    return {k: _unquote(v) for k, v in _KV_RE.findall(line[body_start:i])}


class HloIndex:
    """The instructions of one optimized HLO module, by name.

    Attributes:
      module: the module's name (``HloModule <name>``; a GPU trace's ``hlo_module``), ``""``
        when the text has no header.
      instructions: instruction name -> :class:`Instruction`, over all computations.
      computations: computation name -> its instruction names in order.
    """

    def __init__(self, module: str, instructions: Dict[str, Instruction],
                 computations: Dict[str, List[str]], root: str = ROOT):
        self.module = module
        self.instructions = instructions
        self.computations = computations
        self.root = root
        self._by_kernel: Dict[str, List[str]] = collections.defaultdict(list)
        for inst in instructions.values():
            self._by_kernel[sanitize(inst.name)].append(inst.name)
            if inst.deduplicated_name and inst.deduplicated_name != inst.name:
                self._by_kernel[sanitize(inst.deduplicated_name)].append(inst.name)

    def __len__(self) -> int:
        return len(self.instructions)

    def kernel_instructions(self, kernel: str) -> List[Instruction]:
        """The instructions a kernel named ``kernel`` can stand for: the one it is named after
        (``sanitize(name) == kernel``) and those whose metadata's ``deduplicated_name`` names
        it (XLA's kernel reuse, where the optimized HLO records it), the former first. ``[]``
        for kernels not named after an instruction (cuBLAS, cuDNN, Pallas)."""
        names = sorted(self._by_kernel.get(kernel, ()), key=lambda n: sanitize(n) != kernel)
        return [self.instructions[n] for n in names]

    def fused_instructions(self, name: str) -> List[Instruction]:
        """The non-trivial instructions (:data:`TRIVIAL_OPCODES` left out) of the computations
        that instruction ``name`` calls with ``calls=``, recursively (a fusion's fused
        computation and the fusions nested in it); ``[]`` for an unknown name or no calls."""
        out, seen = [], set()
        todo = list(self.instructions[name].calls) if name in self.instructions else []
        while todo:
            comp = todo.pop(0)
            if comp in seen:
                continue
            seen.add(comp)
            for n in self.computations.get(comp, ()):
                inst = self.instructions[n]
                if inst.calls:
                    todo.extend(inst.calls)
                if inst.opcode not in TRIVIAL_OPCODES and inst.opcode != "fusion":
                    out.append(inst)
        return out

    def _in_repo(self, f: Frame) -> bool:
        path = os.path.normpath(f.file)
        return (path.startswith(os.path.normpath(self.root) + os.sep)
                and "site-packages" not in path)

    def callers(self, inst: Instruction, depth: int = 3) -> List[str]:
        """``path:line`` of up to ``depth`` frames of ``inst`` in this repository after
        :meth:`frame` (its callers, innermost first): where a generic helper's line (a dense
        layer's matmul) was called from. ``[]`` without frames there."""
        mine = [f for f in inst.frames if self._in_repo(f)]
        return [f"{short_path(f.file, self.root)}:{f.line}" for f in mine[1:1 + depth]]

    def frame(self, inst: Instruction) -> Optional[Frame]:
        """The frame that locates ``inst``: its innermost frame in this repository (a file under
        ``root`` and not in ``site-packages``), else its innermost frame; ``None`` without one."""
        for f in inst.frames:
            if self._in_repo(f):
                return f
        return inst.frames[0] if inst.frames else None

    def source(self, inst: Instruction) -> str:
        """``path:line`` of :meth:`frame` (path from :func:`short_path`), ``""`` without one."""
        f = self.frame(inst)
        return "" if f is None else f"{short_path(f.file, self.root)}:{f.line}"

    def attribute(self, name: str, max_sources: int = 5) -> Optional[dict]:
        """Where instruction ``name`` comes from; ``None`` if the module has no such instruction.

        Returns a dict: ``hlo_op`` (``name``), ``opcode``, ``op_name``, ``source``
        (``path:line``) and ``callers`` (:meth:`callers`) of the instruction itself, or of its
        called computation's root when the instruction has no metadata of its own (``""`` /
        ``[]`` when neither has); ``sources``: up to
        ``max_sources`` ``{"source", "op_name", "ops"}`` of its fused instructions grouped by
        source line and op name, most instructions first (``[]`` for an unfused instruction).
        """
        inst = self.instructions.get(name)
        if inst is None:
            return None
        fused = self.fused_instructions(name)
        main = inst
        if not inst.op_name and not inst.frames:
            roots = [i for i in fused if i.is_root and (i.op_name or i.frames)]
            main = roots[0] if roots else next((i for i in fused if i.op_name or i.frames), inst)
        groups: Dict[Tuple[str, str], int] = collections.Counter()
        for i in fused:
            if i.op_name or i.frames:
                groups[(self.source(i), i.op_name)] += 1
        sources = [dict(source=s, op_name=o, ops=k)
                   for (s, o), k in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))]
        return dict(hlo_op=name, opcode=inst.opcode, op_name=main.op_name,
                    source=self.source(main), callers=self.callers(main),
                    sources=sources[:max_sources])


def _table_rows(lines: Sequence[str], start: int) -> Tuple[Dict[int, str], int]:
    """``id -> rest of line`` of a table's rows from ``lines[start]`` to the first blank line;
    returns the rows and the index after them."""
    rows, i = {}, start
    while i < len(lines) and lines[i].strip():
        head, _, rest = lines[i].strip().partition(" ")
        if not head.isdigit():
            break
        rows[int(head)] = rest
        i += 1
    return rows, i


def _stack_frames(tables: Dict[str, Dict[int, str]]) -> Dict[int, Tuple[Frame, ...]]:
    """stack frame id -> its frames, innermost first, from the module's printed tables."""
    files = {k: _unquote(v) for k, v in tables.get("FileNames", {}).items()}
    functions = {k: _unquote(v) for k, v in tables.get("FunctionNames", {}).items()}
    locations = {}
    for k, v in tables.get("FileLocations", {}).items():
        kv = dict(_KV_RE.findall(v))
        try:
            locations[k] = Frame(files.get(int(kv.get("file_name_id", 0)), ""),
                                 int(kv.get("line", 0)),
                                 functions.get(int(kv.get("function_name_id", 0)), ""))
        except ValueError:
            continue
    raw = {}
    for k, v in tables.get("StackFrames", {}).items():
        kv = dict(_KV_RE.findall(v))
        try:
            raw[k] = (int(kv.get("file_location_id", 0)), int(kv.get("parent_frame_id", 0)))
        except ValueError:
            continue
    # XLA prints parent_frame_id one above the parent's id (0 would be "no parent", printed as
    # 1 for frame 1); a parent printed >= the frame's own id can only mean that convention.
    shift = 1 if any(p >= k for k, (_, p) in raw.items()) else 0
    out = {}
    for k in raw:
        chain, seen, cur = [], set(), k
        while cur in raw and cur not in seen:
            seen.add(cur)
            loc, parent = raw[cur]
            if loc in locations:
                chain.append(locations[loc])
            cur = parent - shift
        out[k] = tuple(chain)
    return out


def parse_hlo(text: str, root: str = ROOT) -> HloIndex:
    """An :class:`HloIndex` of an HLO module's text (``Compiled.as_text()``).

    Args:
      text: one module's text, as ``jax.stages.Compiled.as_text()`` prints it (``%`` before
        names optional; metadata with ``source_file``/``source_line`` or ``stack_frame_id``).
      root: the repository root for :meth:`HloIndex.frame` and :func:`short_path`.

    Returns:
      The index (empty for text without computations).

    Raises:
      TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_hlo needs the module's text, got {type(text).__name__}")
    lines = text.splitlines()
    module, tables, pending = "", {}, []
    computations: Dict[str, List[str]] = {}
    comp = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if not module and (m := _MODULE_RE.match(line)):
            module = m.group(1)
        elif line.strip() in _TABLES and comp is None:
            tables[line.strip()], i = _table_rows(lines, i + 1)
            continue
        elif comp is None and (m := _COMPUTATION_RE.match(line)):
            comp = m.group(2)
            computations[comp] = []
        elif comp is not None and line.startswith("}"):
            comp = None
        elif comp is not None and (m := _INSTRUCTION_RE.match(line)):
            calls = ()
            if c := _CALLS_RE.search(line):
                calls = tuple(n.strip().lstrip("%") for n in c.group(1).strip("{}").split(",")
                              if n.strip())
            pending.append((comp, m.group(2), m.group(4), bool(m.group(1)), calls,
                            _metadata(line)))
            computations[comp].append(m.group(2))
        i += 1
    frames_of = _stack_frames(tables)
    instructions = {}
    for comp, name, opcode, is_root, calls, meta in pending:
        frames: Tuple[Frame, ...] = ()
        if meta.get("stack_frame_id", "").isdigit() and int(meta["stack_frame_id"]) in frames_of:
            frames = frames_of[int(meta["stack_frame_id"])]
        elif meta.get("source_file") and meta.get("source_line", "").isdigit():
            frames = (Frame(meta["source_file"], int(meta["source_line"])),)
        instructions[name] = Instruction(
            name=name, opcode=opcode, computation=comp, op_name=meta.get("op_name", ""),
            frames=frames, calls=calls, deduplicated_name=meta.get("deduplicated_name", ""),
            is_root=is_root)
    return HloIndex(module, instructions, computations, root=root)
