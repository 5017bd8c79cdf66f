#!/usr/bin/python3
"""The include graph of yuanlm's folders: each folder of src/ is a node, and cuda/ one node (cuda/emu, the
emulator, is left out: it stands in for the CUDA toolkit, not for a layer). Prints the folders bottom-up, each with
its layer (one above the highest folder it includes; '?' on or above a cycle) and the folders it includes, and
exits 1 naming the folders of a cycle and the #include lines that close it, so that a
layer never reaches up. It also exits 1 naming each file outside src/comm/ that includes MPI or NCCL (<mpi.h>,
<nccl.h>, or the headers of comm/ that bring them): one layer owns the job's communication, and the CUDA
communicator's own file (NCCL_FILES) is the only other. Run from anywhere: /usr/bin/python3 tools/folder_graph.py"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
# What brings MPI or NCCL into a file, and the files besides comm/'s that may include it.
COMM_INCLUDE = re.compile(r'\s*#\s*include\s+(<mpi\.h>|<nccl\.h>|"comm/mpi_check\.h"|"comm/mpi_group\.h")')
NCCL_FILES = {'cuda/nccl_communicator.cu'}


def folder(path):
    """The node of a repository-relative path: 'cuda', 'main' (src/main.cpp) or the folder under src/."""
    parts = path.split('/')
    if parts[0] == 'cuda':
        return 'cuda'
    return parts[1] if len(parts) > 2 else 'main'


def sources():
    for top in ('src', 'cuda'):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(x for x in dirs if os.path.relpath(os.path.join(d, x), ROOT) != 'cuda/emu')
            for f in sorted(files):
                if f.endswith(('.h', '.cpp', '.cu', '.cuh')):
                    yield os.path.relpath(os.path.join(d, f), ROOT)


def resolve(including, name):
    """The file an #include "name" in `including` means, as the compilers' -Isrc -Icuda search finds it; None for
    headers outside the repository."""
    for candidate in (os.path.join(os.path.dirname(including), name), os.path.join('src', name),
                      os.path.join('cuda', name)):
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return os.path.normpath(candidate)
    return None


def graph():
    """edges[a] = {b: ['file:line', ...]} for each include from folder a into another folder b."""
    edges = {}
    for path in sources():
        a = folder(path)
        edges.setdefault(a, {})
        with open(os.path.join(ROOT, path), encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                target = m and resolve(path, m.group(1))
                if target and folder(target) != a:
                    edges[a].setdefault(folder(target), []).append(f'{path}:{number}')
    return edges


def layers(edges):
    """The folders by layer, lowest first: a folder's layer is one above the highest it includes (Kahn's rounds);
    and the folders left over, which lie on or above a cycle."""
    rounds, placed = [], set()
    while True:
        ready = sorted(a for a in edges if a not in placed and all(b in placed for b in edges[a]))
        if not ready:
            return rounds, [a for a in sorted(edges) if a not in placed]
        rounds.append(ready)
        placed.update(ready)


def find_cycle(edges, among):
    """A shortest cycle among the folders `among` (what layers() leaves over), as a list of folders closing on
    itself: the fewest include lines to look at."""
    best = None
    for start in among:
        parent, frontier = {start: None}, [start]
        while frontier and start not in [b for a in frontier for b in edges[a]]:
            step = []
            for a in frontier:
                for b in sorted(edges[a]):
                    if b in among and b not in parent:
                        parent[b] = a
                        step.append(b)
            frontier = step
        if not frontier:
            continue
        path, a = [start], next(a for a in frontier if start in edges[a])
        while a is not None:
            path.append(a)
            a = parent[a]
        path.reverse()
        if best is None or len(path) < len(best):
            best = path
    return best


def communication_outside_comm():
    """'file:line: what' for each include of MPI or NCCL outside src/comm/ and NCCL_FILES."""
    found = []
    for path in sources():
        if path.startswith('src/comm/') or path in NCCL_FILES:
            continue
        with open(os.path.join(ROOT, path), encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                m = COMM_INCLUDE.match(line)
                if m:
                    found.append(f'{path}:{number}: {m.group(1)}')
    return found


def main():
    status = 0
    for problem in communication_outside_comm():
        print(f'error: {problem}: MPI and NCCL belong to src/comm/ (ask it by name: comm/world.h, comm/groups.h, '
              'comm/channel.h)', file=sys.stderr)
        status = 1
    edges = graph()
    rounds, left = layers(edges)
    order = [a for r in rounds for a in r] + left
    for a in order:
        layer = next((str(i) for i, r in enumerate(rounds) if a in r), '?')
        print(f'{layer:>2}  {a:<9} -> {" ".join(sorted(edges[a], key=order.index)) or "(nothing)"}')
    if not left:
        return status
    cycle = find_cycle(edges, left)
    sys.stdout.flush()
    print(f'error: the folders {" -> ".join(cycle)} include each other in a cycle:', file=sys.stderr)
    for a, b in zip(cycle, cycle[1:]):
        print(f'  {a} -> {b}: {", ".join(edges[a][b])}', file=sys.stderr)
    return 1


if __name__ == '__main__':
    sys.exit(main())
