#!/usr/bin/python3
"""Writes tests/data/bpe/: a small GPT-2-style byte-level BPE trained with HuggingFace `tokenizers` (the oracle),
the same tokenizer as GPT-2's vocab.json + merges.txt pair, a Llama-3-style variant (a Split with its own pattern
before a regex-less ByteLevel, ignore_merges), and cases.json: adversarial texts with the ids HF gives them in each
form, id lists (cut inside characters, random) with the text HF decodes them to, more added tokens with the ids
of texts holding them, and the ids of texts split by patterns that can match nothing. tests/test_bpe.cpp checks
yuanlm's BPE against them.

Run with /usr/bin/python3 from the repository root after `pip install --break-system-packages tokenizers`:
  /usr/bin/python3 tools/make_bpe_fixture.py
Training is deterministic for a given `tokenizers` version and input; the fixture is committed, so the tests do not
need `tokenizers`.
"""
import json
import os
import random
import sys
import tempfile
import unicodedata

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

OUT = "tests/data/bpe"
VOCAB = 800
EOT = "<|endoftext|>"
# The demo corpus (Debian's fortunes-zh: Tang poems, Song ci) and English prose, so that both scripts get merges.
CORPUS = ["/usr/share/games/fortunes/tang300", "/usr/share/games/fortunes/song100",
          "/usr/share/common-licenses/GPL-3"]
# Llama 3's pre-tokenizer pattern: case-insensitive contractions, digits in threes, newlines apart.
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")


def category_samples():
    """A few code points of every Unicode general category (surrogates cannot be UTF-8), each category once
    spaced and once run together."""
    by_cat = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        by_cat.setdefault(unicodedata.category(chr(cp)), []).append(cp)
    texts = []
    for cat in sorted(by_cat):
        cps = by_cat[cat]
        pick = sorted({cps[0], cps[1 % len(cps)], cps[len(cps) // 2], cps[-1]})
        chars = [chr(c) for c in pick]
        texts.append(f"{cat}: " + " ".join(chars))
        texts.append("x" + "".join(chars) + "1")
    return texts


def adversarial():
    t = ["", "Hello world", "Hello  world!", "It's", "IT'S", "they'LL", "we'Re", "I'd've", "don't", "'s'S'll'LL'D",
         "'ſ 'K 'ﬆ", "O'Neil's 'quoted'", "rock 'n' roll'", "''", "'", " 's"]
    t += ["  leading", "trailing   ", " " * 100 + "x", "a" + " " * 50, "\n\n\n", "\t\t x", "a\r\nb", " \n \t \n",
          "x \n\n y", "end\n", "  \t\n  z", " " * 1000 + "end", "\n" * 300, "1" * 700, "a" * 600]
    t += ["1234567890 3.14159 1,000,000 ٣٤٥ ①② ½ Ⅻ 𝟘𝟙", "abc123def", "2026-11-29T04:30Z", "v1.2.3-rc4"]
    t += [EOT, "before" + EOT + "after", "a " + EOT + " b", EOT + EOT, "<|endoftext", "x<|endoftext|>y\n" + EOT,
          "<|endoftext|" + EOT + "|>"]
    t += ["床前明月光，疑是地上霜。举头望明月，低头思故乡。", "日本語のテキスト、カタカナ", "한국어 텍스트입니다",
          "𠀀𠀁 𪚥 〇"]
    t += ["👍🏽 thumbs", "👨‍👩‍👧‍👦 family", "🏳️‍🌈", "🇨🇳🇺🇸🇩🇪", "a😀b😀😀 c", "❤️‍🔥 ©️ ™"]
    t += ["e\u0301 é", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "नमस्ते दुनिया", "สวัสดีครับ", "مَرْحَبًا بِالْعَالَمِ", "שָׁלוֹם",
          "Ελληνικά Кириллица"]
    t += ["\x00\x01\x07\x1b[31mred\x1b[0m\x7f", "a\x85b \x85 c\x80\x9f", "\x0b\x0c vertical \x0b", "a\x00b"]
    t += ["a\u00a0b \u00a0 c", "\u1680x\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200ay",
          "a\u2028b\u2029c", "\u202f\u205f\u3000 wide", "zero\u200bwidth\ufeffbom", "x\u180ey", "  \u00a0  \u3000 q"]
    t += category_samples()
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        t.append(f.read()[:800])
    with open("/usr/share/games/fortunes/song100", encoding="utf-8") as f:
        t.append(f.read()[:800])
    return t


def gpt2_style(vocab_merges_dir=None):
    if vocab_merges_dir:
        tok = Tokenizer(BPE.from_file(f"{vocab_merges_dir}/vocab.json", f"{vocab_merges_dir}/merges.txt"))
        tok.add_special_tokens([EOT])
    else:
        tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = gpt2_style()
    trainer = BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[EOT], show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(CORPUS, trainer)
    tok.save(f"{OUT}/tokenizer.json", pretty=False)
    tok.model.save(OUT)  # vocab.json, merges.txt

    # The Llama-3-style variant of the same vocabulary and merges.
    spec = json.load(open(f"{OUT}/tokenizer.json", encoding="utf-8"))
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    spec["model"]["ignore_merges"] = True
    with open(f"{OUT}/tokenizer_split.json", "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, separators=(",", ":"))
    split = Tokenizer.from_file(f"{OUT}/tokenizer_split.json")
    pair = gpt2_style(OUT)

    cases = []
    for text in adversarial():
        ids = tok.encode(text).ids
        assert pair.encode(text).ids == ids, f"vocab.json+merges.txt differ from tokenizer.json on {text!r}"
        assert tok.decode(ids, skip_special_tokens=False) == text, f"HF does not round-trip {text!r}"
        cases.append({"text": text, "ids": ids, "split_ids": split.encode(text).ids})
    # Ids that stop or start inside a character, and random ids: HF's decode replaces what is not UTF-8 by U+FFFD.
    rng = random.Random(1)
    decodes = [c["ids"][1:] for c in cases if 1 < len(c["ids"]) <= 60 and 0 not in c["ids"]][:40]
    decodes += [c["ids"][:-1] for c in cases if 1 < len(c["ids"]) <= 60 and 0 not in c["ids"]][:40]
    decodes += [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 40))] for _ in range(40)]
    decodes = [{"ids": ids, "text": tok.decode(ids)} for ids in decodes]
    # More added tokens, overlapping and of both kinds (special ones matched first, then the normalized others):
    # the test puts these added_tokens into tokenizer.json.
    more = Tokenizer.from_file(f"{OUT}/tokenizer.json")
    more.add_special_tokens(["<|a|>", "<|a|>b", EOT + "x"])
    more.add_tokens([AddedToken(" world", normalized=True), AddedToken("a|", normalized=True)])
    added_tokens = json.loads(more.to_str())["added_tokens"]
    texts = ["a<|a|>b c<|a|>bb <|a|> hello world" + EOT + "x y", EOT + "<|a|>b world", " world world", "a|a||",
             "the world<|a|>", "<|a|" + EOT + "x", "x<|a" + "|>b" + EOT]
    added = {"added_tokens": added_tokens, "cases": [{"text": t, "ids": more.encode(t).ids} for t in texts]}

    # Split patterns that can match nothing: HF cuts at an empty match too. The test puts each pattern into a Split
    # before a regex-less ByteLevel.
    empty = []
    for pattern in ["x*", "a?", "(?=b)", r"\s*", r"(?<=\p{L})(?=\p{N})"]:
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
        spec["model"]["ignore_merges"] = False
        variant = Tokenizer.from_str(json.dumps(spec))
        for t in ["abxxc", "xab", "bab the cat", "  a  b\n", "abc123def 45 x6", ""]:
            empty.append({"pattern": pattern, "text": t, "ids": variant.encode(t).ids})
    with open(f"{OUT}/cases.json", "w", encoding="utf-8") as f:
        # A case per line keeps the file small and its diffs readable.
        head = {"tokenizers": tokenizers.__version__, "eot_id": tok.token_to_id(EOT),
                "vocab_size": tok.get_vocab_size()}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases) + "\n],\n")
        f.write('"decode": [\n' + ",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                                              for c in decodes) + "\n],\n")
        f.write('"added": ' + json.dumps(added, ensure_ascii=False, separators=(",", ":")) + ",\n")
        f.write('"empty_matches": ' + json.dumps(empty, ensure_ascii=False, separators=(",", ":")) + "}\n")
    size = sum(os.path.getsize(f"{OUT}/{n}") for n in os.listdir(OUT))
    print(f"{OUT}: {len(cases)} cases, vocab {tok.get_vocab_size()}, {size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
