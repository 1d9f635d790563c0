"""Summarizes ncu's SASS source page (CSV, `--page source --print-source sass --csv`) of one kernel:
stall samples by reason and by opcode, per 1 KB block of code (with its commonest opcodes and the
instructions it executed, to tell the roles' code apart), the mbarrier waits (a `TRYWAIT` and the
branch that retries it), and the busiest instructions.

    python summarize.py src_h16.csv [TOP]
"""

import collections
import csv
import sys


def opcode_of(text: str) -> str:
    words = text.split()
    word = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?")
    return word.split(".")[0]


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))  # ncu prints its own lines too
    start = next(k for k, row in enumerate(rows) if row and row[0] == "Address")  # after the kernel's name
    header = rows[start]
    col = {name: i for i, name in enumerate(header)}
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    program = []  # (offset, instruction, samples, executed, {reason: samples})
    for row in rows[start + 1:]:
        try:
            address = int(row[col["Address"]], 16)
            samples = int(float(row[col["Warp Stall Sampling (All Samples)"]] or 0))
            executed = int(float(row[col["Instructions Executed"]] or 0))
        except (ValueError, IndexError):
            continue
        why = {name: int(float(row[col[name]] or 0)) for name in reasons}
        program.append((address, row[col["Source"]].strip(), samples, executed, why))
    base = program[0][0]
    total = max(sum(p[2] for p in program), 1)
    by_reason, by_opcode = collections.Counter(), collections.Counter()
    for _, text, samples, _, why in program:
        by_reason.update(why)
        by_opcode[opcode_of(text)] += samples
    print(f"{path}: {len(program)} instructions, {total} samples, "
          f"{sum(p[3] for p in program) / 1e6:.0f}M warp instructions executed")
    print("by reason: " + ", ".join(f"{name[6:]} {100 * n / total:.1f}%" for name, n in by_reason.most_common(10) if n))
    print("by opcode: " + ", ".join(f"{name} {100 * n / total:.1f}%" for name, n in by_opcode.most_common(12)))
    print("per 1 KB of code (offset, samples, instructions executed, commonest opcodes), blocks over 1%:")
    blocks = collections.OrderedDict()
    for address, text, samples, executed, _ in program:
        block = blocks.setdefault((address - base) // 0x400, [0, 0, collections.Counter()])
        block[0] += samples
        block[1] += executed
        block[2][opcode_of(text)] += 1
    for block, (samples, executed, opcodes) in blocks.items():
        if samples > total / 100:
            print(f"  +{block * 0x400:05x} {100 * samples / total:5.1f}% {executed / 1e6:6.1f}M  "
                  + " ".join(name for name, _ in opcodes.most_common(5)))
    print("mbarrier waits (the retry branch after a TRYWAIT), over 0.3%:")
    for (address, text, samples, _, _), (_, before, _, _, _) in zip(program[1:], program):
        if "TRYWAIT" in before and opcode_of(text) == "BRA" and samples > total * 0.003:
            print(f"  +{address - base:05x} {100 * samples / total:5.1f}%  {before[:60]}")
    print(f"the {top} busiest instructions (offset, samples, its two main reasons, the instruction before it):")
    ranked = sorted(range(len(program)), key=lambda k: -program[k][2])[:top]
    for k in sorted(ranked):
        address, text, samples, _, why = program[k]
        main = " ".join(f"{name[6:]}:{n}" for name, n in sorted(why.items(), key=lambda x: -x[1])[:2] if n)
        before = program[k - 1][1] if k else ""
        print(f"  +{address - base:05x} {100 * samples / total:5.1f}%  {text[:56]:<56} {main:<26} | {before[:36]}")


if __name__ == "__main__":
    main()
