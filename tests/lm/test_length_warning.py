"""transformers' "Token indices sequence length is longer than the specified maximum" is silenced on the LM
tokenizers epr loads: epr counts and encodes texts of any length with them and reports a text too long for the LM
itself (the API's warning names the query), so the user sees one message, not two."""

from __future__ import annotations

import logging

import pytest

LONG = "how do I reset my email " * 4000


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_log():
    h = Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(h)
    yield h.messages
    logger.removeHandler(h)


def too_long(messages) -> list[str]:
    return [m for m in messages if "Token indices sequence length is longer" in m]


def test_plain_tokenizer_warns(tiny_lm_dir, transformers_log):
    """Negative control: the tokenizer as transformers loads it warns (what the tests below check is silenced)."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tiny_lm_dir)(LONG, add_special_tokens=False)
    assert len(too_long(transformers_log)) == 1


def test_lm_tokenizers_do_not_warn(tiny_lm_dir, transformers_log):
    from epr.config import load_config
    from epr.lm.models import load_lm, load_tokenizer_for

    _, tok = load_lm(tiny_lm_dir, dtype="fp32")
    tok(LONG, add_special_tokens=False)
    cfg = load_config([], [f"models.lm={tiny_lm_dir}"])
    load_tokenizer_for(cfg.models)(LONG, add_special_tokens=False)
    assert too_long(transformers_log) == []


def test_long_query_one_message_not_two(tiny_lm_dir, transformers_log, caplog):
    """The reported case: a long query through the API printed transformers' warning beside epr's own."""
    from tests.stub_encoder import stub_retriever

    r = stub_retriever(tiny_lm_dir)
    with caplog.at_level(logging.WARNING, logger="epr.api"):
        res = r.retrieve(LONG, k=2)
    assert res.prompt_demos == 0 and "leaves no room in the prompt budget" in caplog.text
    assert too_long(transformers_log) == []
