"""The calls the pinned-digest test makes, in the API of the code under test."""

from fear_assets.lm.choices import choice_logprobs
from fear_assets.lm.scoring import ScoringSettings, build_requests, score_requests


def document_scores(engine, tokenizer, rows, bank, builder):
    requests = build_requests(rows, bank.templates, builder.document_text)
    config = ScoringSettings(context_window=900, max_new_tokens=5, layers_fraction_from=1 / 3)
    return requests, score_requests(engine, tokenizer, requests, config)


def choices(engine, tokenizer, prefix, bodies, answers):
    return choice_logprobs(engine, tokenizer, prefix, bodies, answers)
