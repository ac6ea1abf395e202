"""`ai`: honest small text analytics: word/sentence statistics and keyword extraction."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

# A short English stop list: keywords are the frequent words that are not these.
STOPWORDS = frozenset(
    """a an and are as at be but by for from has have he her his i in is it its of on or
    our she that the their them they this to was we were will with you your not no so
    if then than there these those which who what when where how can could would should
    do does did been being into over under about after before also just more most""".split()
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    text = str(params["text"])
    words = [w.lower() for w in _WORD.findall(text)]
    sentences = [s for s in (m.strip() for m in _SENTENCE.findall(text)) if s]
    ctx.progress(50, step="tokenised")
    counts = Counter(w for w in words if w not in STOPWORDS and len(w) > 2)
    keywords = [word for word, _ in counts.most_common(10)]
    return {
        "words": len(words),
        "unique_words": len(set(words)),
        "sentences": len(sentences),
        "avg_words_per_sentence": round(len(words) / len(sentences), 2) if sentences else 0,
        "keywords": keywords,
    }
