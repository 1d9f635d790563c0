"""The tail split's plan: which work items the kernel cuts into parts, and into how many.

The kernel runs one persistent CTA per SM; the plan may only cut the items of the last, partial round
into parts that fit the round beside each other, each of at least 256 slots (512 past 8 rounds), at most
4 per item; past 8 rounds never where the call would otherwise run a narrow tile (at most 32 heads).
"""

from __future__ import annotations

import pytest

from sparse_mla.launch import split_plan


@pytest.mark.parametrize(
    "items, num_sms, topk, plan",
    [
        (437, 132, 2048, (396, 3)),  # s_q 437 at h_q 64: 41 items in the 4th round, 3 parts each
        (1, 132, 2048, (0, 4)),      # one item: 4 parts (the limit)
        (66, 132, 2048, (0, 2)),     # half a round: 2 parts fill it
        (67, 132, 2048, (67, 1)),    # more than half a round: no split
        (132, 132, 2048, (132, 1)),  # full rounds: no split
        (990, 132, 2048, (924, 2)),   # 8 rounds: the most that split in parts of 256 slots
        (1100, 132, 2048, (1056, 3)),  # 9 rounds: parts of at least 512 slots
        (1100, 132, 1024, (1056, 2)),
        (1100, 132, 512, (1100, 1)),  # 9 rounds at topk 512: a part would hold fewer than 512 slots
        (4096, 132, 2048, (4092, 4)),  # s_q 4096 at h_q 64: 31 rounds and 4 items, in 4 parts
        (8192, 132, 2048, (8184, 4)),
        (437, 132, 512, (396, 2)),   # topk 512: 2 parts of 256 slots at most
        (437, 132, 256, (437, 1)),   # topk 256: a part would hold fewer than 256 slots
        (0, 132, 2048, (0, 1)),
    ],
)
def test_examples(items, num_sms, topk, plan):
    assert split_plan(items, num_sms, topk) == plan


@pytest.mark.parametrize("items, plan", [(437, (396, 3)), (990, (924, 2)), (1100, (1100, 1)), (4096, (4096, 1))])
def test_a_narrow_call_splits_only_within_8_rounds(items, plan):
    assert split_plan(items, 132, 2048, narrow=True) == plan


def test_every_plan_cuts_only_the_last_round_into_parts_that_fit_it():
    for num_sms in (1, 2, 78, 114, 132):
        for topk in (1, 64, 255, 256, 511, 512, 1024, 2048, 4096):
            for items in range(0, 10 * num_sms + 2):
                for narrow in (False, True):
                    split_begin, parts = split_plan(items, num_sms, topk, narrow=narrow)
                    context = f"items {items}, num_sms {num_sms}, topk {topk}, narrow {narrow}: plan {(split_begin, parts)}"
                    if parts == 1:
                        assert split_begin == items, context
                        continue
                    tail = items - split_begin
                    short = items <= 8 * num_sms
                    assert 2 <= parts <= 4 and topk // parts >= (256 if short else 512), context
                    assert split_begin % num_sms == 0 and 0 < tail and tail * parts <= num_sms, context
                    # never a split when the last round is more than half full, nor past 8 rounds of a narrow call
                    assert 2 * tail <= num_sms and (short or not narrow), context


@pytest.mark.parametrize("items", [1, 66, 437, 990])
def test_the_batch_invariant_mode_never_splits(items):
    assert split_plan(items, 132, 2048) != (items, 1)
    assert split_plan(items, 132, 2048, batch_invariant=True) == (items, 1)
