"""tools/check_references.py: stale paths and config keys found in each kind of file it reads, and patterns,
outputs and prose left alone, on a small repository written for each test; and the real one clean."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, TOOLS)
import check_references as cr  # noqa: E402

CONFIG = '{"train.steps", &c.train.steps, "optimizer steps"},\n{"ckpt.local_every", &c.ckpt.local_every, "x"},\n'
# The files every small repository has, all their references good.
BASE = {
    "src/config/config.cpp": CONFIG,
    "src/parallel/watchdog.h": "// Deadlines; the tests are tests/test_watchdog.cpp, the tool tools/plot.py.\n",
    "src/train/train.cpp": '#include "parallel/watchdog.h"\n',
    "src/train/train.h": "",
    "src/backend/backend.h": "",
    "tests/test_watchdog.cpp": "/* parallel/watchdog.h, src/parallel/, train.cpp and\n   docs/A.md */\n",
    "tools/plot.py": '"""Reads run.dir/metrics.jsonl (train.steps lines)."""\n# see ../docs/A.md\n',
    "docs/A.md": "Set `--ckpt.local_every=5`; [B](B.md); `src/train/train.{h,cpp}`\n",
    "docs/B.md": "jobs/train.sbatch, `runs/NAME/ckpt`, data/demo/, <dir>/x.h, $HOME/y.sh, /usr/bin/python3,\n"
                 "tokens/s, model/optimizer, https://github.com/x/y/blob/z.py, config.ini, `tests/test_*.cpp`\n",
    "jobs/train.sbatch": "#!/bin/bash\n# tools/plot.py after the run\n"
                         "n=${#a[@]}  # $# and the quoted # are no comments\necho '# src/none.h' \"# src/none.h\"\n",
    "Makefile": "# make builds bin/yuanlm from src/train/train.cpp\n",
}


def run(extra):
    """The problems check_references reports on BASE with `extra` files written over it."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in {**BASE, **extra}.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        return cr.check(root)


class Stale(unittest.TestCase):
    def test_clean_repository(self):
        self.assertEqual(run({}), [])

    def test_c_comment_paths(self):
        self.assertEqual(run({"src/train/metrics.h": "int x;  // tools/plotter.py reads it\n"
                                                      "/* one\n   backend/ops.h two */\n"
                                                      'const char* s = "// src/gone.h";\n'}),
                         ["src/train/metrics.h:1: 'tools/plotter.py' does not exist",
                          "src/train/metrics.h:3: 'backend/ops.h' does not exist"])

    def test_raw_strings_and_digit_separators(self):
        self.assertEqual(run({"tests/test_x.cpp": 'auto a = R"(// src/raw.h)";\nint n = 1\'000;  // gone.cpp\n'}),
                         ["tests/test_x.cpp:2: 'gone.cpp' does not exist"])

    def test_python_shell_and_makefile_comments(self):
        problems = run({"tools/a.py": '"""From tools/old.py."""\nx = "tools/data.py"  # and docs/OLD.md\n',
                        "tests/mpi/test_a.sh": "#!/bin/bash\n# after jobs/train.sbatch and tests/mpi/gone.sh\n",
                        "Makefile": "all:  # links src/gone.cpp\n"})
        self.assertEqual(problems, ["Makefile:1: 'src/gone.cpp' does not exist",
                                    "tests/mpi/test_a.sh:2: 'tests/mpi/gone.sh' does not exist",
                                    "tools/a.py:1: 'tools/old.py' does not exist",
                                    "tools/a.py:2: 'docs/OLD.md' does not exist"])

    def test_markdown_paths_links_globs_and_braces(self):
        problems = run({"README.md": "See [C](docs/C.md#top), `tests/*.py`, `src/train/train.{cpp,py}`,\n"
                                     "and [D](D.md) and the `parallel/` folder.\n"})
        self.assertEqual(problems, ["README.md:1: 'docs/C.md' does not exist",
                                    "README.md:1: 'tests/*.py' does not exist",
                                    "README.md:1: 'src/train/train.py' does not exist",
                                    "README.md:2: 'D.md' does not exist"])

    def test_config_keys(self):
        problems = run({"docs/C.md": "`train.steps`, `--ckpt.every=10` and run.dir/ckpt; train.sbatch\n",
                        "src/a.cpp": "// optim.offload = host, train.steps; train.size() and c.train.lr are code\n"
                                     'f(x.train.steps);  // the user sets train.step\n'
                                     'throw Error("set ckpt.local = 5 (not train.steps)");\n',
                        "tests/test_a.cpp": 'EXPECT_THROW(parse("--train.lr=3"));  // a wrong key on purpose\n'})
        self.assertEqual(problems, ["docs/C.md:1: 'ckpt.every' is not a config key",
                                    "src/a.cpp:2: 'train.step' is not a config key",
                                    "src/a.cpp:3: 'ckpt.local' is not a config key"])

    @unittest.skipUnless(shutil.which("git"), "needs git")
    def test_a_moved_folder_still_reads_as_a_path(self):
        """After a folder moves, prose naming the old one is stale, though no folder has that name now."""
        with tempfile.TemporaryDirectory() as root:
            git = ["git", "-C", root, "-c", "user.name=t", "-c", "user.email=t@t"]
            for path, text in {**BASE, "docs/C.md": "The `parallel/` folder; parallel/watchdog.h.\n"}.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(text)
            subprocess.run(git[:3] + ["init", "-q"], check=True)
            subprocess.run(git + ["add", "."], check=True)
            subprocess.run(git + ["commit", "-qm", "a"], check=True)
            subprocess.run(git + ["mv", "src/parallel", "src/comm"], check=True)
            subprocess.run(git + ["commit", "-qm", "b"], check=True)
            problems = [p for p in cr.check(root) if p.startswith("docs/C.md")]
        self.assertEqual(problems, ["docs/C.md:1: 'parallel/' does not exist",
                                    "docs/C.md:1: 'parallel/watchdog.h' does not exist"])

    def test_exit_status_and_lines(self):
        with tempfile.TemporaryDirectory() as root:
            for path, text in {**BASE, "docs/C.md": "tools/gone.py\n"}.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(text)
            p = subprocess.run([sys.executable, os.path.join(TOOLS, "check_references.py"), "--root", root],
                               capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "docs/C.md:1: 'tools/gone.py' does not exist\n")


if __name__ == "__main__":
    unittest.main()
