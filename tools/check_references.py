#!/usr/bin/python3
"""References that cannot go stale: every repository path named in a comment (src/, cuda/, tests/, tools/, jobs/,
env/, input/, the Makefile) or in a Markdown file (README.md, docs/), and every config key they name, must exist.
Prints each stale one as `file:line: 'path' does not exist` or `file:line: 'key' is not a config key` and exits 1
when there is any. Standard library only, no build needed: the config keys are read from the option table in
src/config/config.cpp. Run from anywhere: /usr/bin/python3 tools/check_references.py [--root DIR]

The rules keep false positives near zero, so that a failure always means an edit to make. A line is cut into words
at blanks, quotes, backticks, brackets, commas and semicolons, then at '=' and ':' (`--machine=FILE`, `FILE:42`),
after `{a,b}` is expanded; './', a link's '#anchor' and trailing punctuation are taken off. A word names a
repository path when it is
- made only of letters, digits and `_ . / + -`, or `*` for a glob: placeholders and variables (`<name>`, `$dir/x`,
  `%h`, `...`, an all-capitals folder as in `runs/NAME/ckpt`) are patterns, not paths;
- relative: absolute paths, `~/...`, URLs and `user@host` name things outside the repository;
- not under what a build or a run writes (GENERATED), unless it has a source extension (`data/loader.h`), and not
  one of the few names of other projects' files that read like the repository's (ELSEWHERE);
- and either a folder whose name a folder of the repository has or had (`comm/`, `tests/mpi/`: git's history
  keeps a moved folder's name a path); or with a '/', a first folder the repository has or had and either an
  extension its files have or that first folder at its top (`docs/gpu-runs`); or without a '/', a file name with
  one of the repository's own extensions (`.h`, `.cpp`, `.cu`, `.cuh`, `.py`, `.sh`, `.md`, `.ini`, `.sbatch`).
  Prose such as `model/optimizer`, `tokens/s` or NCCL's `src/graph/tuning.cc` is left alone.
It exists when it resolves from the folder of the file naming it, from the repository root, from src/ or from
cuda/ (the compilers' -Isrc -Icuda: code names headers as `backend/backend.h`); a path whose first folder is not at
the top also when it ends a repository path (`nvtx3/nvToolsExt.h`), and a bare file name when a file of that name
is anywhere (prose says `train.cpp` where the folder is plain). A glob exists when it matches a file.

A config key is a `section.key` word whose section is one of the option table's (`train.steps`, `--ckpt.every=5`,
`run.dir/ckpt`), and not a file name (`train.sbatch`) or, in code, a member access or call (`data.size()`). Keys
are also read in the string literals of src/ and cuda/: the messages that tell the user what to set."""
import argparse
import fnmatch
import functools
import io
import os
import re
import subprocess
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Folders whose comments are read, and the top-level files; every Markdown file is read whole.
CODE_TOPS = ('src', 'cuda', 'tests', 'tools', 'jobs', 'env', 'input')
CODE_FILES = ('Makefile',)
C_LIKE = ('.h', '.cpp', '.cu', '.cuh')
HASH_LIKE = ('.sh', '.sbatch', '.yaml', '.example')

# Extensions that make a bare file name a reference to a repository file.
OWN_EXTENSIONS = {'h', 'cpp', 'cu', 'cuh', 'py', 'sh', 'md', 'ini', 'sbatch'}
SOURCE_EXTENSIONS = ('.h', '.cpp', '.cu', '.cuh', '.py', '.sh')

# What a build or a run writes, folders and the few files prose names bare: made, not kept, so that a name there
# cannot go stale in the repository.
GENERATED = {
    'build': 'object files, dependency files, test logs and fetched headers of `make` (.gitignore)',
    'bin': 'the binaries `make` links (.gitignore)',
    'runs': 'run directories of the demo, the tests and jobs/*.sbatch (.gitignore)',
    'data': 'corpora that `yuanlm prep` writes; `make run` prepares data/demo (.gitignore)',
    'logs': 'SLURM output files of jobs/*.sbatch (.gitignore)',
    'run.dir': "the config key naming a run's directory, and so everything a run writes",
    'ckpt': "a run's checkpoints (run.dir/ckpt)",
    'root': 'the Debian packages env/device-kit.sh unpacks into its kit',
    'env.sh': 'the environment script env/device-kit.sh writes into its kit',
    'config.ini': 'the resolved config rank 0 saves in run.dir',
    'scaling.md': "the report tools/scaling.py writes into a sweep's directory",
}
# Names of other projects' files and folders that read like the repository's own.
ELSEWHERE = {
    'cudnn.h': "cuDNN's header, which the emulator's cuDNN stands in for",
    'cudnn_frontend_shim.h': "the cuDNN frontend's, fetched into build/ by env/fetch-cudnn-frontend.sh",
    'llama.cpp': 'a project',
    'modeling_gpt2.py': "HuggingFace transformers' GPT-2",
    'lib': "an installed package's prefix, as `*_HOME/lib/`",
    'lib64': "an installed package's prefix, as `*_HOME/lib64/`",
    'include': "an installed package's prefix, as `*_HOME/include/`",
}

# What a C++ scanner must see whole: comments, and the literals a // or /* inside of which is no comment (a raw
# string, a string, a character; 1'000's quote is a digit separator).
C_TOKENS = re.compile(r'''//[^\n]*|/\*.*?(?:\*/|\Z)|(?<!\w)(?:u8|u|U|L)?R"([^(\s"]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"'''
                      r"|(?<!\w)'(?:\\.|[^'\\\n])*'", re.S)
CONFIG_KEY = re.compile(r'\{"([a-z_]+)\.([a-z_0-9]+)", &c\.')
WORD_CUT = re.compile(r'[\s`\'"()\[\],;|]+')
BRACES = re.compile(r'(\S*?)\{([^{}\s]*,[^{}\s]*)\}(\S*)')
PATH_CHARS = re.compile(r'^[A-Za-z0-9_./+*-]+$')
# `section.key`, not inside a longer dotted name or path, nor (in code) followed by a call, index or member.
KEY_WORD = re.compile(r'(?<![\w.>/$-])(?:--)?([a-z_]+)\.([a-z_0-9]+)\b(?![(\[]|\.\w|->)')


def tracked_files(root):
    """The repository's files, relative to root: git's list where root is a checkout (new files not yet added
    included, ignored ones left out), else a walk."""
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                             capture_output=True, check=True).stdout
        files = [f for f in out.decode().split('\0') if f and os.path.isfile(os.path.join(root, f))]
        if files:
            return sorted(files)
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith('.') and x not in GENERATED)
        found += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(found)


def folders_ever(root):
    """The folders that ever held a file of the repository, from git's history (none outside a checkout), so that
    a folder's name still reads as a path once the folder is gone."""
    try:
        out = subprocess.run(['git', '-C', root, 'log', '--format=', '--name-only'], capture_output=True,
                             check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return set()
    return {os.path.dirname(p) for p in out.split('\n') if '/' in p}


def config_keys(root):
    """{section: {key, ...}} from the option table of src/config/config.cpp."""
    keys = {}
    with open(os.path.join(root, 'src', 'config', 'config.cpp'), encoding='utf-8') as f:
        for section, key in CONFIG_KEY.findall(f.read()):
            keys.setdefault(section, set()).add(key)
    if not keys:  # else every key would pass unchecked
        sys.exit('error: no config key found in src/config/config.cpp\'s table; CONFIG_KEY no longer matches its rows')
    return keys


# ---- comments, as (line number, text) ----

def c_comments(text, literals=False):
    """The // and /* */ comments of C, C++ and CUDA source, outside string and character literals (raw strings
    included); a block comment yields each of its lines. With `literals`, the string literals instead."""
    line, at = 1, 0
    for m in C_TOKENS.finditer(text):
        token = m.group(0)
        if token.startswith(('//', '/*')) == literals or token.startswith("'"):
            continue
        line += text.count('\n', at, m.start())
        at = m.start()
        body = token[2:-2] if token.startswith('/*') and token.endswith('*/') else token[2:]
        for k, part in enumerate((token if literals else body).split('\n')):
            yield line + k, part


def hash_comments(text):
    """The # comments of shell, Makefile and YAML files: a # at the start of a line or after a blank, outside the
    quotes of its line, so that $#, ${#a[@]} and '#' are not comments."""
    for number, line in enumerate(text.split('\n'), 1):
        quote = None
        for k, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in '\'"' and (k == 0 or line[k - 1] != '\\'):
                quote = ch
            elif ch == '#' and (k == 0 or line[k - 1] in ' \t'):
                yield number, line[k + 1:]
                break


def ini_comments(text):
    """The comment lines of a deck or machine file (# or ;)."""
    for number, line in enumerate(text.split('\n'), 1):
        stripped = line.lstrip()
        if stripped.startswith((';', '#')):
            yield number, stripped[1:]


def python_comments(text):
    """A Python file's # comments and docstrings (a string that is a statement of its own)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        yield from hash_comments(text)
        return
    found = [(t.start[0], t.string[1:]) for t in tokens if t.type == tokenize.COMMENT]
    code = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL)]
    statement_start = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for k, t in enumerate(code):
        if (t.type == tokenize.STRING and (k == 0 or code[k - 1].type in statement_start)
                and (k + 1 == len(code) or code[k + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER))):
            found += [(t.start[0] + j, part) for j, part in enumerate(t.string.split('\n'))]
    yield from sorted(found)


def comments(path, text):
    """The commented text of a source file by its kind; None for files that are not read (data, binaries)."""
    name = os.path.basename(path)
    first = text.split('\n', 1)[0]
    if name.endswith(C_LIKE):
        return c_comments(text)
    if name.endswith('.py') or (first.startswith('#!') and 'python' in first):
        return python_comments(text)
    if name.endswith('.ini'):
        return ini_comments(text)
    if name.endswith(HASH_LIKE) or name == 'Makefile' or first.startswith('#!'):
        return hash_comments(text)
    return None


# ---- words ----

def expand_braces(text):
    """`src/optim/zero.{h,cpp}` as `src/optim/zero.h src/optim/zero.cpp`, as the shell would."""
    def one(m):
        return ' '.join(m.group(1) + alt + m.group(3) for alt in m.group(2).split(','))
    previous = None
    while previous != text:
        previous, text = text, BRACES.sub(one, text)
    return text


def words(text):
    """The candidate words of a line (see the module's docstring)."""
    for raw in WORD_CUT.split(expand_braces(text)):
        if not raw or '://' in raw or '@' in raw:
            continue
        for part in re.split(r'[=:]', raw):
            part = part.split('#', 1)[0].rstrip('.,!?')
            while part.startswith('./'):
                part = part[2:]
            if part:
                yield part


class Repo:
    def __init__(self, root):
        self.root = root
        self.files = tracked_files(root)
        self.file_set = set(self.files)
        self.dirs = set()
        for f in self.files:
            d = os.path.dirname(f)
            while d and d not in self.dirs:
                self.dirs.add(d)
                d = os.path.dirname(d)
        ever = set(self.dirs)
        for d in folders_ever(root):
            while d and d not in ever:
                ever.add(d)
                d = os.path.dirname(d)
        # The folder names a path may start with: the repository's, present or past.
        self.dir_names = {os.path.basename(d) for d in ever}
        self.tops = {d for d in ever if '/' not in d}
        self.basenames = {os.path.basename(f) for f in self.files}
        self.extensions = {f.rsplit('.', 1)[1] for f in self.basenames if '.' in f.strip('.')}
        self.keys = config_keys(root)
        self.is_path = functools.lru_cache(maxsize=None)(self.is_path)  # the same words recur in every file

    def exists(self, rel):
        rel = os.path.normpath(rel)
        return rel in self.file_set or rel in self.dirs

    def resolves(self, naming_file, word):
        path = word.rstrip('/')
        first = path.split('/')[0]
        if '*' in path:
            return any(fnmatch.fnmatchcase(f, path) for f in self.files)
        if any(self.exists(os.path.join(base, path)) for base in (os.path.dirname(naming_file), '', 'src', 'cuda')):
            return True
        if '/' not in path and not word.endswith('/'):
            return path in self.basenames
        return first not in self.tops and first != '..' and any(
            p.endswith('/' + path) for p in self.file_set | self.dirs)

    def is_path(self, word):
        """Whether a word names a repository path (see the module's docstring)."""
        if not PATH_CHARS.match(word) or word.startswith(('/', '-', '.')) and not word.startswith('../'):
            return False
        if '..' in word.replace('../', '') or word.startswith('*'):
            return False
        parts = [p for p in word.split('/') if p not in ('', '..')]
        if not parts or any('.' not in p and p.isupper() for p in parts):
            return False
        first, last = parts[0], parts[-1]
        if first in ELSEWHERE or ('*' in word and first not in self.tops):
            return False
        if first in GENERATED and (len(parts) == 1 or not last.endswith(SOURCE_EXTENSIONS)):
            return False
        extension = last.rsplit('.', 1)[1] if '.' in last.strip('.') else None
        if word.endswith('/'):
            return word.startswith('../') or first in self.dir_names
        if len(parts) == 1:
            return extension in OWN_EXTENSIONS and not last.startswith('.')
        if extension is not None and extension not in self.extensions and '*' not in extension:
            return False
        return word.startswith('../') or (first in self.dir_names and (extension is not None or first in self.tops))

    def stale_keys(self, text):
        """The `section.key` words of a line whose section is the option table's and whose key it lacks."""
        for m in KEY_WORD.finditer(text):
            section, key = m.group(1), m.group(2)
            if section in self.keys and key not in self.keys[section] and key not in self.extensions:
                yield f'{section}.{key}'


def scanned(root, files):
    """(path, iterator of (line, text)) for every file whose comments or whole text are read."""
    for path in files:
        is_markdown = path.endswith('.md')
        if not is_markdown and path.split('/')[0] not in CODE_TOPS and path not in CODE_FILES:
            continue
        try:
            with open(os.path.join(root, path), encoding='utf-8') as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        lines = enumerate(text.split('\n'), 1) if is_markdown else comments(path, text)
        if lines is not None:
            yield path, lines


def check(root):
    """Every stale reference, as 'file:line: ...' lines in file order."""
    repo = Repo(root)
    problems = []
    for path, lines in scanned(root, repo.files):
        for number, text in lines:
            problems += [f"{path}:{number}: '{key}' is not a config key" for key in repo.stale_keys(text)]
            for word in words(text):
                if repo.is_path(word) and not repo.resolves(path, word):
                    problems.append(f"{path}:{number}: '{word}' does not exist")
    # The program's own messages name keys for the user to set (cuda/cuda_adamw.cu: "optim.offload = host"); the
    # tests' name wrong ones on purpose.
    for path in repo.files:
        if path.split('/')[0] in ('src', 'cuda') and path.endswith(C_LIKE):
            with open(os.path.join(root, path), encoding='utf-8') as f:
                for number, text in c_comments(f.read(), literals=True):
                    problems += [f"{path}:{number}: '{key}' is not a config key" for key in repo.stale_keys(text)]
    return sorted(problems, key=lambda p: (p.split(':')[0], int(p.split(':')[1])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default=ROOT, help='the repository to check (default: this one)')
    args = parser.parse_args()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f'{len(problems)} stale reference(s): name what replaced each, or drop the reference',
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
