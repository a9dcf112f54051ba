#!/usr/bin/env python3
"""The programmatic-dependent-launch contract (include/tessera/device/pdl.cuh) over the CUDA sources.

Any kernel under kernels/ may be launched with launch_pdl, which lets it start while the previous kernel of the
stream still runs. That is safe only if every block executes pdl_wait before touching what an earlier kernel
wrote, so every __global__ definition must either open with pdl_enter() or call pdl_wait() (kernels that read
weights first). kernels/core/ holds device smoke tests launched plainly and is exempt.

Usage: pdl_contract.py SOURCE_ROOT. Prints each offending kernel and exits 1; exits 0 when all comply."""
import pathlib
import re
import sys

EXEMPT = ('kernels/core/',)


def kernel_bodies(text):
    """(name, body) of each __global__ definition: the body is the brace block after the parameter list."""
    for m in re.finditer(r'__global__', text):
        i, depth, name_end = m.end(), 0, None
        while i < len(text):
            c = text[i]
            if c == '(':
                if depth == 0 and name_end is None:
                    name_end = i
                depth += 1
            elif c == ')':
                depth -= 1
            elif depth == 0 and c == ';':
                break  # a declaration
            elif depth == 0 and c == '{':
                j, d = i, 0
                while j < len(text):
                    d += {'{': 1, '}': -1}.get(text[j], 0)
                    if d == 0:
                        break
                    j += 1
                head = text[m.end():i]
                # __launch_bounds__(...) opens the first parenthesis of some kernels; the name precedes the parameters.
                names = re.findall(r'(\w+)\s*\(', head)
                name = [n for n in names if n != '__launch_bounds__']
                yield (name[0] if name else '?'), text[i + 1:j]
                break
            i += 1


def main():
    root = pathlib.Path(sys.argv[1])
    bad, seen = [], 0
    for path in sorted((root / 'kernels').rglob('*')):
        if path.suffix not in ('.cu', '.cuh'):
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith(EXEMPT):
            continue
        for name, body in kernel_bodies(path.read_text()):
            seen += 1
            code = re.sub(r'//[^\n]*', '', body).strip()
            if not (code.startswith('device::pdl_enter();') or re.search(r'\bpdl_wait\(\)', code)):
                bad.append(f'{rel}: {name} neither opens with device::pdl_enter() nor calls pdl_wait()')
    for b in bad:
        print(b)
    print(f'pdl contract: {seen} kernels checked, {len(bad)} without the wait')
    return 1 if bad or seen == 0 else 0


if __name__ == '__main__':
    sys.exit(main())
