"""Text rules of ``data clean``: normalisation, URLs and web boilerplate, script (language) share.

Kept deliberately simple and explainable: each rule says why a row was dropped.
"""

from __future__ import annotations

import re
import unicodedata

_WS = re.compile(r"\s+")
URL = re.compile(r"(?i)\b(?:https?://|ftp://|www\.)\S+|\b[\w.-]+\.(?:com|org|net|edu|io|cn)/\S*")
BOILERPLATE = re.compile(
    r"(?i)\b(?:click here|subscribe|sign up|log ?in to|all rights reserved|copyright ©|©\s*\d{4}|cookie policy|"
    r"privacy policy|terms of (?:service|use)|enable javascript|share this|posted by|read more|advertisement)\b"
)


def normalize(text: str) -> str:
    """NFKC, lower case, whitespace collapsed. Math symbols stay: '3 + 4' and '3 - 4' differ."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", str(text)).lower()).strip()


def web_junk(text: str) -> str:
    """The URL or boilerplate phrase found in ``text`` ('' if none)."""
    m = URL.search(text) or BOILERPLATE.search(text)
    return m.group(0) if m else ""


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F  # Han
            or 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF  # Hiragana, Katakana
            or 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F  # Hangul
            or 0xF900 <= o <= 0xFAFF)  # CJK compatibility ideographs


def cjk_fraction(text: str) -> float:
    """Share of CJK characters among the letters of ``text`` (digits, symbols and LaTeX commands'
    Latin letters count as letters too, so a formula-heavy English problem stays near 0)."""
    letters = [ch for ch in str(text) if ch.isalpha()]
    if not letters:
        return 0.0
    return sum(_is_cjk(ch) for ch in letters) / len(letters)


def word_ngrams(text: str, n: int) -> set:
    words = normalize(text).split()
    if len(words) < n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def char_shingles(text: str, k: int = 5) -> set:
    t = normalize(text)
    if len(t) <= k:
        return {t}
    return {t[i:i + k] for i in range(len(t) - k + 1)}
