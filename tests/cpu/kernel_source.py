"""The kernel's synchronization statements, read from its headers, as the happens-before model names them.

`function_nodes(text, name)` parses one function definition of a header into statements: a compound
statement is a list; `if` (and `if constexpr`), `for`, `return`, `continue` and lambda definitions are
nodes of their own; any other statement is its text. `sync_path(...)` then walks one execution of it:
- a statement yields its operations (OPERATIONS below) in the order they appear in its text, the
  arguments of a call before the call;
- an `if` whose branches hold no operation, return or continue is skipped; any other is decided by
  the caller's table, keyed by the condition's text (whitespace collapsed), or by each operand of a
  condition `a && b` (its operations only where the operands before it held): an `if` nobody
  decided is an error, so a new branch around an operation must be decided by whoever adds it;
- a `for` runs once, or as often as the caller's table says for its header;
- a lambda's body is walked where it is called;
- while, do, switch, break and goto are errors (the kernel's role functions have none).
Each operation is an Op (the model's Event.op, the shared buffer's name without its indices, the
header's line): what the model's events of the same function are compared with. Global memory,
registers and the wgmma register fences are not operations here, as they are not in the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Op:
    op: str  # the model's Event.op: "mbarrier.wait", "st.shared", ...
    target: str = ""  # the shared buffer or barrier, without indices
    line: int = 0  # of the header, 1-based (0: not from a header)
    name: str = ""  # the model's name of the statement (an Op made from a model event)

    def key(self):
        return self.op, self.target


def strip_comments(text: str) -> str:
    """The text with its comments blanked out (newlines kept, so that offsets keep their line)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)


def closing_bracket(text: str, i: int) -> int:
    """The index of the bracket that closes the one at text[i]."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for j in range(i, len(text)):
        if text[j] in pairs:
            stack.append(pairs[text[j]])
        elif text[j] in ")]}":
            assert stack and stack.pop() == text[j], f"unbalanced at {j}"
            if not stack:
                return j
    raise ValueError("unclosed bracket")


@dataclass
class _Source:
    text: str  # comments blanked
    starts: list = field(default_factory=list)  # offset of each line

    def line(self, offset):
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1


@dataclass
class Stmt:
    text: str
    offset: int


@dataclass
class If:
    cond: Stmt
    then: list
    orelse: list


@dataclass
class For:
    header: str
    body: list


@dataclass
class Lambda:
    name: str
    body: list


@dataclass
class Exit:  # return or continue: leaves the function or the loop's iteration
    kind: str
    stmt: Stmt


class Function:
    """One function definition of a header, parsed into statements."""

    def __init__(self, text: str, name: str, index: int = 0):
        self.source = _Source(strip_comments(text))
        self.source.starts = [0] + [m.end() for m in re.finditer("\n", self.source.text)]
        self.name = name
        bodies = []
        for m in re.finditer(rf"\b{re.escape(name)}\s*\(", self.source.text):
            close = closing_bracket(self.source.text, m.end() - 1)
            after = re.match(r"\s*(const\s*)?\{", self.source.text[close + 1:])
            if after and not re.search(r"[=;,(]\s*$", self.source.text[:m.start()]):  # a definition
                bodies.append(close + after.end())
        assert len(bodies) > index, f"no definition {index} of {name}"
        brace = bodies[index] - 1
        close = closing_bracket(self.source.text, brace)
        self.body_text = self.source.text[brace + 1:close]  # comments blanked
        self.body = self._block(brace + 1, close)

    def _block(self, i, end):
        text, nodes = self.source.text, []
        while True:
            while i < end and text[i].isspace():
                i += 1
            if i >= end:
                return nodes
            if text[i] == "#":  # a pragma
                i = text.index("\n", i)
            elif m := re.match(r"(while|do|switch|break|goto)\b", text[i:]):
                raise ValueError(f"{self.source.line(i)}: {m.group(1)}: a statement kernel_source.py does not walk")
            elif text[i] == "{":
                close = closing_bracket(text, i)
                nodes.append(self._block(i + 1, close))
                i = close + 1
            elif m := re.match(r"if\s*(constexpr\s*)?\(", text[i:]):
                open_ = i + m.end() - 1
                close = closing_bracket(text, open_)
                then, i = self._statement(close + 1, end)
                orelse = []
                if m2 := re.match(r"\s*else\b", text[i:]):
                    orelse, i = self._statement(i + m2.end(), end)
                nodes.append(If(Stmt(text[open_ + 1:close], open_ + 1), then, orelse))
            elif m := re.match(r"for\s*\(", text[i:]):
                open_ = i + m.end() - 1
                close = closing_bracket(text, open_)
                body, i = self._statement(close + 1, end)
                nodes.append(For(" ".join(text[open_ + 1:close].split()), body))
            else:
                node, i = self._simple(i, end)
                nodes.append(node)

    def _statement(self, i, end):
        """One statement from i (a block, or a single one): its nodes and where it ends."""
        while self.source.text[i].isspace():
            i += 1
        if self.source.text[i] == "{":
            close = closing_bracket(self.source.text, i)
            return self._block(i + 1, close), close + 1
        j = self._end_of_statement(i, end)
        return self._block(i, j), j

    def _end_of_statement(self, i, end):
        text = self.source.text
        if re.match(r"(if|for)\b", text[i:]):  # nested control statement: its own extent
            m = re.match(r"(if\s*(constexpr\s*)?|for\s*)\(", text[i:])
            close = closing_bracket(text, i + m.end() - 1)
            _, j = self._statement(close + 1, end)
            if m.group(1).startswith("if") and (m2 := re.match(r"\s*else\b", text[j:])):
                _, j = self._statement(j + m2.end(), end)
            return j
        j = i
        while text[j] != ";":
            j = closing_bracket(text, j) + 1 if text[j] in "([{" else j + 1
        return j + 1

    def _simple(self, i, end):
        j = self._end_of_statement(i, end)
        text = self.source.text[i:j]
        if m := re.match(r"(const\s+)?auto\s+(\w+)\s*=\s*\[[^\]]*\]\s*(\([^)]*\))?\s*\{", text):
            brace = i + m.end() - 1
            return Lambda(m.group(2), self._block(brace + 1, closing_bracket(self.source.text, brace))), j
        if m := re.match(r"(return|continue)\b", text):
            return Exit(m.group(1), Stmt(text, i)), j
        return Stmt(text, i), j


# ---- Operations: the statements of the kernel that the model's events stand for. ----
# A call that stands for some of the model's events: the events, in order, after those of the call's
# arguments (the buffers without their stage and block indices).
CALLS = {
    "issue_qk": [("wgmma", "q"), ("wgmma", "kv"), ("wgmma.commit_group", "")],
    "issue_qk_narrow": [("wgmma", "q"), ("wgmma", "kv"), ("wgmma.commit_group", "")],
    "issue_pv": [("wgmma", "probs"), ("wgmma.commit_group", "")],
    "issue_pv_narrow": [("wgmma", "probs"), ("wgmma", "probs"), ("wgmma.commit_group", "")],
    "load_v_fragments": [("ldmatrix", "kv")],
    "write_probs": [("st.shared", "probs")],
    "write_probs_narrow": [("st.shared", "probs")],
    "clear_v_nans": [("st.shared", "kv")],
    "grouped_row_words": [("ld.shared", "row_valid")],
    "fence_view_async_shared": [("fence.proxy.async", "")],
    "cp_async_commit": [("cp.async.commit_group", "")],
}
# cp.async's copies and the producer's row gathers (gather.cuh) made of them: the buffer their first
# argument, the destination address, points into.
COPY_CALLS = ("cp_async_16", "cp_async_8", "copy_row_chunks", "copy_row")
BARRIER_CALLS = {"mbarrier_wait": "mbarrier.wait", "mbarrier_arrive": "mbarrier.arrive",
                 "cp_async_arrive_noinc": "mbarrier.arrive.noinc"}
# Calls that look like synchronization but are none of the model's (it has no global memory and no
# registers): the warp's shuffles and votes, the grid dependency and global-memory fences, the
# wgmma register fences, and a tile's trait. Any other call whose name looks like synchronization
# and that no rule here reads is an error, so that a new kind of operation cannot pass unseen.
NOT_MODELLED = {"__shfl_sync", "__shfl_xor_sync", "__ballot_sync", "__all_sync", "__threadfence",
                "wait_for_grid_ahead", "allow_dependent_grid", "fence_operands", "warpgroup_arrive", "copies_arrive"}
_LOOKS_LIKE_SYNC = re.compile(r"sync|fence|wait|arrive|barrier|commit|cp_async|ldmatrix|st_shared|ld_shared|wgmma")
_TOKEN = re.compile(
    r"\b(?P<call>\w+)\s*(?P<targs><[^<>;()]*>)?\s*\("  # a call, maybe with template arguments
    r"|(?P<addr>&?)\bss\.(?P<member>\w+)"  # a member of the shared storage
)


@dataclass
class _Walk:
    source: _Source
    decide: dict  # condition text -> bool or callable(env)
    loops: dict  # for header -> (variable, count or callable(env))
    env: dict
    calls: tuple  # names of functions whose calls are operations of their own ("call", name)
    not_modelled: frozenset = frozenset(NOT_MODELLED)
    ops: list = field(default_factory=list)
    lambdas: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)  # local name -> shared member its address points into
    probing: bool = False  # has_effect's walk: lambdas' bodies looked through, not walked

    def text_ops(self, text, offset):
        """The operations of one statement's text, in order."""
        line = self.source.line(offset)
        if m := re.match(r"\s*(?:const\s+)?[\w:<>]+\s*\*?\s*(\w+)\s*=\s*(?:smem_addr\s*\(|reinterpret_cast<[^>]*>\s*\()\s*&?ss\.(\w+)",
                         text):
            self.aliases[m.group(1)] = m.group(2)  # an address into a buffer, not an access
            return
        if (m := re.match(r"\s*(\w+)\s*\[[^\]]*\]\s*=(?!=)", text)) and m.group(1) in self.aliases:
            self.ops.append(Op("st.shared", self.aliases[m.group(1)], line))  # a store through the address
        i = 0
        while m := _TOKEN.search(text, i):
            if m.group("member"):
                i = m.end()
                if m.group("addr"):
                    continue  # an address: the call it is passed to accesses the buffer
                j = m.end()
                while j < len(text) and text[j:].lstrip().startswith("["):
                    j = closing_bracket(text, text.index("[", j)) + 1
                stored = re.match(r"\s*=(?!=)", text[j:])
                self.ops.append(Op("st.shared" if stored else "ld.shared", m.group("member"), line))
                continue
            name = m.group("call")
            close = closing_bracket(text, m.end() - 1)
            args = text[m.end():close]
            if name == "smem_addr":
                pass  # an address, as above
            elif name in self.lambdas:
                self.text_ops(args, offset + m.end())
                if self.probing:  # the body's effect, without deciding its branches
                    self.ops += [Op("call", name)] if self.has_effect(self.lambdas[name]) else []
                else:
                    self.walk(self.lambdas[name])
            elif name in BARRIER_CALLS:
                target = re.match(r"\s*&ss\.(\w+)", args).group(1)
                self.ops.append(Op(BARRIER_CALLS[name], target, line))
            elif name in COPY_CALLS:
                first = args.split(",")[0]
                target = re.search(r"ss\.(\w+)", first)
                base = target.group(1) if target else self.aliases[re.match(r"\s*(\w+)", first).group(1)]
                self.ops.append(Op("cp.async", base, line))
            elif name in ("cp_async_wait", "warpgroup_wait"):
                family = "cp.async" if name == "cp_async_wait" else "wgmma"
                self.ops.append(Op(f"{family}.wait_group", m.group("targs").strip("<> "), line))
            elif name in ("named_barrier_sync", "named_barrier_sync_or"):
                self.text_ops(args, offset + m.end())
                self.ops.append(Op("bar.sync", m.group("targs").strip("<>").split(",")[0].strip(), line))
            elif name in CALLS:
                self.text_ops(args, offset + m.end())
                self.ops += [Op(op, target, line) for op, target in CALLS[name]]
            elif name in self.calls:
                self.text_ops(args, offset + m.end())
                self.ops.append(Op("call", name, line))
            elif name == "reinterpret_cast" and re.search(r"\*\s*$", text[:m.start()]) and (
                    member := re.match(r"\s*&ss\.(\w+)", args)):  # *reinterpret_cast<T*>(&ss.x[..]): an access
                stored = re.match(r"\s*=(?!=)", text[close + 1:])
                self.ops.append(Op("st.shared" if stored else "ld.shared", member.group(1), line))
            else:  # a call of no synchronization of its own: only its arguments
                if _LOOKS_LIKE_SYNC.search(name) and name not in self.not_modelled:
                    raise ValueError(f"{line}: {name}: an operation kernel_source.py does not read")
                self.text_ops(args, offset + m.end())
            i = close + 1

    def has_effect(self, nodes):
        """Whether walking nodes could add an operation or leave (an if around nothing is skipped)."""
        probe = _Walk(self.source, {}, {}, {}, self.calls, self.not_modelled, lambdas=self.lambdas,
                      aliases=dict(self.aliases), probing=True)
        for node in _flatten(nodes):
            if isinstance(node, Exit):
                return True
            if isinstance(node, Stmt):
                probe.text_ops(node.text, node.offset)
            elif isinstance(node, Lambda):
                probe.lambdas[node.name] = node.body
        return bool(probe.ops)

    def condition(self, cond):
        """Whether the branch is taken: the table's value for the condition, or for each operand of
        a condition `a && b ...`, evaluated as C++ does (an operand's operations happen only where
        the operands before it were true)."""
        text = " ".join(cond.text.split()).removeprefix("constexpr ")
        operands = [text] if text in self.decide else [o.strip() for o in _top_level_split(text, "&&")]
        for operand in operands:
            if operand not in self.decide:
                raise KeyError(f"{self.source.line(cond.offset)}: undecided: if ({text})")
            self.text_ops(operand, cond.offset)
            taken = self.decide[operand]
            if not (taken(self.env) if callable(taken) else taken):
                return False
        return True

    def walk(self, nodes):
        """Walks nodes; returns "return" or "continue" where one was reached."""
        for node in nodes:
            if isinstance(node, list):
                if exit_ := self.walk(node):
                    return exit_
            elif isinstance(node, Stmt):
                self.text_ops(node.text, node.offset)
            elif isinstance(node, Lambda):
                self.lambdas[node.name] = node.body
            elif isinstance(node, Exit):
                self.text_ops(re.sub(r"^(return|continue)\b", "", node.stmt.text), node.stmt.offset)
                return node.kind
            elif isinstance(node, If):
                if not (self.has_effect(node.then) or self.has_effect(node.orelse)):
                    self.text_ops(node.cond.text, node.cond.offset)
                    continue
                if exit_ := self.walk(node.then if self.condition(node.cond) else node.orelse):
                    return exit_
            elif isinstance(node, For):
                if not self.has_effect(node.body):
                    continue
                var, count = self.loops.get(node.header, (None, 1))
                count = count(self.env) if callable(count) else count
                for k in range(count):
                    if var:
                        self.env[var] = k
                    if self.walk(node.body) == "return":
                        return "return"
        return None


def _top_level_split(text, separator):
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
    return parts + [text[start:]]


def _flatten(nodes):
    for node in nodes:
        if isinstance(node, list):
            yield from _flatten(node)
        elif isinstance(node, If):
            yield node.cond
            yield from _flatten(node.then)
            yield from _flatten(node.orelse)
        elif isinstance(node, For):
            yield from _flatten(node.body)
        else:
            yield node


def sync_path(function: Function, decide=None, loops=None, env=None, calls=(), not_modelled=()) -> list[Op]:
    """The operations of one execution of `function`: each `if` around an operation decided by
    `decide`, each `for` around one run as often as `loops` says (else once), calls of `calls` kept as
    one ("call", name) operation each, calls of `not_modelled` read as none (besides NOT_MODELLED)."""
    walk = _Walk(function.source, decide or {}, loops or {}, dict(env or {}), tuple(calls),
                 frozenset(NOT_MODELLED) | frozenset(not_modelled))
    walk.walk(function.body)
    return walk.ops
