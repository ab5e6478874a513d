"""The calls the pinned-digest test makes, in the API of the code under test."""

from fear_assets.design.document_scores import ScoringSettings, score_requests
from fear_assets.design.requests import build_requests
from fear_assets.lm.choices import choice_batch
from fear_assets.lm.runner import run


def document_scores(engine, tokenizer, rows, bank, builder):
    requests = build_requests(rows, bank.templates, builder.document_text)
    config = ScoringSettings(context_window=900, max_new_tokens=5, layers_fraction_from=1 / 3)
    return requests, score_requests(engine, tokenizer, requests, config)


def choices(engine, tokenizer, prefix, bodies, answers):
    (responses,) = run(engine, [choice_batch(tokenizer, prefix, bodies, answers)])
    return [list(r.logprobs) for r in responses]
