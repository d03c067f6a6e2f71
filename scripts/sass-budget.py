#!/usr/bin/env python3
"""Instruction budget of a compressor kernel, per source region, from its SASS.

Input: `nvdisasm -gi` output of a cubin built with -lineinfo (the CMake build's objects have it:
`cuobjdump -xelf all build/CMakeFiles/dsv4_cuda.dir/src/cuda/compressor/kernels_c512.cu.o`, then
`nvdisasm -gi kernels_c512.sm_90a.cubin > k.sass`). Each instruction goes to a region named by the
functions on its inlining chain (two_pass.cuh, postprocess.cuh, ...); the source files must be
where the cubin was built from.

  sass-budget.py regions K.sass KERNEL_SUBSTRING
      static counts per region of the kernel whose mangled name contains KERNEL_SUBSTRING.
  sass-budget.py walk K.sass KERNEL_SUBSTRING DECISIONS.json [--fall FILE:LINE,...] [--take FILE:LINE,...]
      the instructions one warp issues from the kernel entry to EXIT: every conditional branch is
      decided by DECISIONS.json ({"0xADDR": [taken, taken, ...]} per execution), else by --fall /
      --take (its source line), else the fast paths of 64-bit and float divisions are taken; an
      undecided branch stops the walk and is printed with its context, to be decided and rerun.
      Predicated instructions count as issued.
"""
import argparse
import collections
import json
import re

FRAME = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r'^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;')
SECTION = re.compile(r'^\s*\.section\s+\.text\.(\S+?),')
LABEL = re.compile(r'^(\.L_x_\d+):')

_sources = {}
_functions = {}


def source_lines(path):
    if path not in _sources:
        _sources[path] = open(path).read().split('\n')
    return _sources[path]


def function_of(path, line):
    """The function (or lambda) whose body holds `line`: the nearest definition above it."""
    key = (path, line)
    if key in _functions:
        return _functions[key]
    lines = source_lines(path)
    name = '?'
    for i in range(line - 1, -1, -1):
        text = lines[i]
        m = re.match(r'^(\s*)const auto (\w+) = \[&\]', text)
        if m and i < line - 1:
            end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(m.group(1) + '};'))
            if end + 1 >= line:
                name = m.group(2)
                break
            continue
        m = re.match(r'(?:__device__ __forceinline__|DSV4_HD|__global__|constexpr)\s+[\w:<>,\s&*]*?\b(\w+)\s*\(', text)
        if m:
            name = m.group(1)
            break
        m = re.match(r'\s+__device__ (?:explicit )?(?:[\w<>]+\*? )?(\w+)\(', text)
        if m:
            name = m.group(1)
            break
        if text.startswith('    two_pass_kernel('):
            name = 'two_pass_kernel'
            break
    _functions[key] = name
    return name


def line_of_text(path, *texts):
    for i, line in enumerate(source_lines(path)):
        if any(t in line for t in texts):
            return i + 1
    raise SystemExit(f'{path}: none of {texts} found')


SETUP = {'two_pass_kernel', 'locate_item', 'request_of_item', 'RingRows', 'head_event_count', 'load_norm', 'Staging',
         'step_request', 'ring_item_writes'}
EVENT = {'event_window', 'entry_target', 'window_offsets', 'entry_target_hoisted', 'fast_divide', 'fast_divide_with',
         'two_pass_event', 'step_page'}


def region_of(chain):
    frames = [(function_of(path, line), path, line) for path, line in chain]
    names = [f[0] for f in frames]
    if 'write_ring' in names:
        return 'ring writes (head / ring items)'
    if 'finish_event' in names:
        _, path, line = [f for f in frames if f[0] == 'finish_event'][-1]
        if 'rope_cos_sin' in names:
            return 'RoPE'
        if 'store_attention_entry' in names or 'store_indexer_entry' in names:
            return 'encode + store'
        if line < line_of_text(path, '// 1. bf16, RMSNorm'):
            return 'optional outputs'
        if line < line_of_text(path, '// 2. RoPE'):
            return 'RMSNorm'
        if line < line_of_text(path, '// 3. Encode'):
            return 'RoPE'
        if line < line_of_text(path, 'store_indexer_entry<Config', 'store_indexer_entry(y, lane'):
            return 'Walsh-Hadamard'
        return 'encode + store'
    if 'pool_candidates' in names:
        in_copy = 'copy_batch' in names
        if any(n in names for n in ('copy_async16', 'copy_async_commit', 'copy_async_wait')):
            return 'cp.async issue / wait'
        if 'candidate' in names:
            return 'copy: candidate addresses' if in_copy else 'fold: candidate (ape, is_new)'
        return 'copy: loop' if in_copy else 'fold: softmax'
    if 'merge_groups' in names:
        return 'fold: softmax'
    if 'pool_and_finish' in names:
        return 'final division'
    if any(n in EVENT for n in names):
        return 'event: entry, window, page'
    if any(n in SETUP for n in names):
        return 'item setup'
    return 'other: ' + names[0]


def read_kernel(path, kernel):
    """[(address, text, region, innermost (path, line))] and {label: index} of the kernel."""
    inside, pending, chain, instructions, labels = False, [], [], [], {}
    for raw in open(path):
        m = SECTION.match(raw)
        if m:
            inside = kernel in m.group(1)
            continue
        if not inside:
            continue
        m = FRAME.search(raw)
        if m:
            pending.append((m.group(1), int(m.group(2))))
            continue
        m = LABEL.match(raw)
        if m:
            labels[m.group(1)] = len(instructions)
            continue
        m = INSTRUCTION.match(raw)
        if not m:
            continue
        if pending:
            chain, pending = pending, []
        region = region_of(chain) if chain else 'other'
        instructions.append((int(m.group(1), 16), m.group(2), region, chain[0] if chain else None))
    if not instructions:
        raise SystemExit(f'no kernel matching {kernel!r} in {path}')
    return instructions, labels


def print_counts(counts):
    for region in sorted(counts, key=lambda r: -counts[r]):
        print(f'{region:40s} {counts[region]:6d}')
    print(f'{"total":40s} {sum(counts.values()):6d}')


def regions(args):
    instructions, _ = read_kernel(args.sass, args.kernel)
    print_counts(collections.Counter(r for _, text, r, _ in instructions if not text.startswith('NOP')))


def walk(args):
    instructions, labels = read_kernel(args.sass, args.kernel)
    decisions = json.load(open(args.decisions))
    fall = set(args.fall.split(',')) if args.fall else set()
    take = set(args.take.split(',')) if args.take else set()
    counts, executions, i = collections.Counter(), collections.Counter(), 0
    for _ in range(100000):
        address, text, region, where = instructions[i]
        counts[region] += 1
        if text.startswith('EXIT'):
            break
        m = re.match(r'(@!?U?P\w+ )?BRA(?:\.\w+)* (!?U?P\w+, )?`\((\.L_x_\d+)\)', text)
        if not m:
            i += 1
            continue
        target = labels[m.group(3)]
        if m.group(1) is None and m.group(2) is None:
            i = target
            continue
        key = hex(address)
        choices = decisions.get(key)
        place = f'{where[0].split("/")[-1]}:{where[1]}' if where else ''
        if choices is None and place in fall:
            choices = [False]
        if choices is None and place in take:
            choices = [True]
        if choices is None and any(t.startswith('FCHK') for _, t, _, _ in instructions[max(0, i - 6):i]):
            choices = [True]  # a float division's fast path
        if choices is None and any(t.startswith('I2F.U32.RP') for _, t, _, _ in instructions[target:target + 2]):
            choices = [True]  # a 64-bit division's 32-bit path
        if choices is None:
            source = source_lines(where[0])[where[1] - 1].strip() if where else ''
            print(f'UNDECIDED {key} {text}   [{region}] {place}: {source}')
            for a, t, _, _ in instructions[max(0, i - 5):i]:
                print(f'    {a:#x} {t}')
            print('    target:', ', '.join(f'{a:#x} {t}' for a, t, _, _ in instructions[target:target + 2]))
            break
        taken = choices[min(executions[key], len(choices) - 1)]
        executions[key] += 1
        i = target if taken else i + 1
    print_counts(counts)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('regions')
    p.add_argument('sass')
    p.add_argument('kernel')
    p.set_defaults(run=regions)
    p = sub.add_parser('walk')
    p.add_argument('sass')
    p.add_argument('kernel')
    p.add_argument('decisions')
    p.add_argument('--fall', default='')
    p.add_argument('--take', default='')
    p.set_defaults(run=walk)
    args = parser.parse_args()
    args.run(args)


if __name__ == '__main__':
    main()
