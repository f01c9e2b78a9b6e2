"""Generated multilingual documents and a BPE tokenizer trained on them (no hub can be
reached): the `shard --tokenizer` test and `benches/tokenize_peers.py` share them."""
import json
import random

# Words of several scripts; the tokenizer is trained on a part of them only, so
# documents also hold characters it has never seen (byte fallback).
LATIN = ["the", "data", "loader", "shard", "training", "model", "token", "value", "über",
         "naïve", "café", "jalapeño", "straße", "déjà", "vu", "of", "and", "in", "to", "is"]
CYRILLIC = ["данные", "модель", "обучение", "токен", "загрузчик"]
GREEK = ["δεδομένα", "μοντέλο", "εκπαίδευση"]
CJK = ["数据", "模型", "训练", "分词器", "加载", "日本語", "テキスト", "한국어"]
ARABIC = ["البيانات", "نموذج", "تدريب"]
DEVANAGARI = ["डेटा", "मॉडल", "प्रशिक्षण"]
EMOJI = ["😀", "🚀", "👩‍💻", "🇫🇷", "👍🏽", "❤️", "🧪"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Z\u0351\u0362\u0337"]
PUNCT = [",", ".", "!", "?", ";", ":", "—", "…", "(", ")", "'s", "'re", "\"", "123", "4567", "3.14"]


def document(rng: random.Random, scripts=None) -> str:
    """One document: empty, whitespace, a very long word, or words of mixed scripts."""
    r = rng.random()
    if r < 0.02:
        return ""
    if r < 0.03:
        return rng.choice([" ", "\n", "\t \n  ", "   "])
    if r < 0.04:
        return rng.choice(LATIN) * rng.randint(200, 2000)  # a very long word
    pools = scripts or [LATIN] * 6 + [CYRILLIC, GREEK, CJK, ARABIC, DEVANAGARI, EMOJI, COMBINING, PUNCT]
    words = []
    for _ in range(rng.randint(1, 120)):
        w = rng.choice(rng.choice(pools))
        if rng.random() < 0.1:
            w = w.capitalize()
        words.append(w)
        words.append(rng.choice([" ", " ", " ", "  ", "\n", ", ", ". ", ""]))
    return "".join(words)


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(n)]


def train_tokenizer(path: str, vocab_size: int = 8000, seed: int = 1) -> None:
    """Train a BPE tokenizer with byte fallback (GPT-4-style pre-tokenizer regex with a
    look-ahead, NFC normalizer, `<|endoftext|>` special token) and save it as JSON."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    rng = random.Random(seed)
    # Trained without Arabic, Devanagari and most emoji: those fall back to bytes.
    corpus = [document(rng, [LATIN] * 6 + [CYRILLIC, GREEK, CJK, COMBINING, PUNCT]) for _ in range(4000)]
    corpus += ["".join(chr(c) for c in range(0x21, 0x7F))]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.NFC()
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.ByteFallback()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<|endoftext|>"],
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    # Byte fallback needs the 256 byte tokens <0x00>..<0xFF> in the vocabulary.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = len(vocab)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
