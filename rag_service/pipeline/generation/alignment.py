"""How closely the passage holding the best sentence matches the question, token by token (pure).

The lexical features of answerability.py see only shared word stems, so a passage that paraphrases
the question ("began" for "started") looks no better than a sibling passage that shares the topic's
words and not the asked fact. Here each of the question's content words is matched with its most
similar token of the passage in the local encoder's contextual token space (late interaction, as
ColBERT scores with "MaxSim"; a word split into pieces counts once per piece), and the matches are
weighted by how rare the word is among the retrieved sentences, so the words that single out the
asked fact count most.

Measured on XQuAD (benchmarks/train_answerability.py, article-grouped cross-validation), the two
features raise abstention on questions whose paragraph was removed from 0.69 to 0.73 at the same
answered rate when read on every answer, and to 0.72 when read only near the threshold, as the
generator does. The passage is the best sentence and the one after it, which did as well as a
three-sentence window with fewer tokens to encode.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rag_service.providers.embeddings import TokenVectors
from rag_service.text.sentences import split_sentences
from rag_service.text.terms import terms


def passage(chunk: str, sentence: str) -> str:
    """The best sentence and the sentence after it in its chunk (the sentence alone if it is last
    or cannot be found)."""
    sentences = split_sentences(chunk)
    for i, s in enumerate(sentences):
        if s.text == sentence:
            return chunk[s.start:sentences[min(i + 1, len(sentences) - 1)].end]
    return sentence


def words_of(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """The whole word each token is part of (a word piece maps to its word; a token without a
    letter or digit, such as the question mark, to "")."""
    words = []
    for start, end in spans:
        if not any(c.isalnum() for c in text[start:end]):
            words.append("")
            continue
        while start > 0 and text[start - 1].isalnum():
            start -= 1
        while end < len(text) and text[end].isalnum():
            end += 1
        words.append(text[start:end])
    return words


def alignment(question: str, asked: TokenVectors, found: TokenVectors, idf: Mapping[str, float]) -> tuple[float, float]:
    """(weighted mean, worst weighted miss) of the question's content tokens' best cosine with any
    token of the passage. Weights are the rarest stem's IDF among the retrieved sentences (a stem
    not there weighs more than any that is); the worst miss is ``(1 - cosine) * weight`` of the
    least matched token, relative to that largest weight. Without content words, every token counts."""
    if not len(found.vectors) or not len(asked.vectors):
        return 0.0, 1.0
    words = words_of(question, asked.spans)
    content = [i for i, w in enumerate(words) if terms(w)] or list(range(len(words)))
    unseen = max(idf.values(), default=1.0) + 1.0
    weights = np.array([max((idf.get(t, unseen) for t in terms(words[i])), default=1.0) for i in content])
    best = (asked.vectors[content] @ found.vectors.T).max(axis=1)
    return float((best * weights).sum() / weights.sum()), float(((1.0 - best) * weights).max() / unseen)
