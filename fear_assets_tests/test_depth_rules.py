from fear_assets.pilot.depth_rules import depth_band, h5_depth
from fear_assets.pilot.report_rule import mentions, partner_keywords


def test_depth_band_takes_the_depths_within_the_registered_rates(settings):
    rule = settings.depth_band_rule
    band, why = depth_band({1: 0.95, 2: 0.8, 3: 0.5, 4: 0.2, 5: 0.1}, rule.neutral_mention_low,
                           rule.neutral_mention_high, rule.min_depths, rule.fallback_target)
    assert band == [2, 3, 4] and "within" in why


def test_depth_band_falls_back_to_the_two_closest_to_half_when_fewer_than_two_qualify(settings):
    rule = settings.depth_band_rule
    band, why = depth_band({1: 0.99, 2: 0.9, 3: 0.79, 4: 0.05}, rule.neutral_mention_low,
                           rule.neutral_mention_high, rule.min_depths, rule.fallback_target)
    assert band == [2, 3] and why.startswith("fallback")
    band, _ = depth_band({1: 0.95, 2: 0.85, 3: 0.1}, 0.2, 0.8, 2, 0.5)
    assert band == [2, 3]


def test_h5_depth_is_the_deepest_in_range_else_closest_to_075(settings):
    rule = settings.h5_depth_rule
    args = rule.accuracy_low, rule.accuracy_high, rule.fallback_target
    assert h5_depth({1: 0.99, 2: 0.85, 3: 0.7, 4: 0.55}, *args)[0] == 3
    depth, why = h5_depth({1: 0.99, 2: 0.95, 3: 0.5}, *args)
    assert depth == 2 and why.startswith("fallback")


def test_keyword_rule_for_the_neutral_partner():
    keys = partner_keywords("The weekly planning meeting will move to Room 3.", "Room 3")
    assert keys == ["Room 3", "weekly planning meeting"]
    assert mentions("Note that the weekly planning meeting moved.", keys)
    assert mentions("It is now in room 3.", keys)
    assert not mentions("Room 30 is closed.", keys) and not mentions(None, keys)
