"""The tier contract's context handling: parsing, nesting, exceptions, threads and asyncio tasks."""
import asyncio
import threading

import pytest

import accelpatch
from accelpatch.core.tiers import Tier, effective_tier, parse_tier, requested_tier


@pytest.mark.parametrize("text,tier", [("exact", Tier.EXACT), ("LOSSLESS", Tier.LOSSLESS), (" High ", Tier.HIGH)])
def test_parse_is_case_insensitive(text, tier):
    assert parse_tier(text) is tier


@pytest.mark.parametrize("bad", ["fast", "", "extra-high", 2, None])
def test_unknown_tier_names_the_value_and_the_valid_tiers(bad):
    with pytest.raises(ValueError, match=r"valid tiers are exact, lossless, high") as info:
        with accelpatch.quality(bad):
            pass
    assert repr(bad) in str(info.value)
    assert accelpatch.current_quality() == "lossless"


def test_tiers_nest():
    assert Tier.HIGH.admits(Tier.LOSSLESS) and Tier.LOSSLESS.admits(Tier.EXACT)
    assert not Tier.LOSSLESS.admits(Tier.HIGH) and not Tier.EXACT.admits(Tier.LOSSLESS)


def test_default_is_lossless_and_blocks_nest():
    assert accelpatch.current_quality() == "lossless" and requested_tier() is None
    with accelpatch.quality("high"):
        assert accelpatch.current_quality() == "high"
        with accelpatch.quality("exact"):
            assert accelpatch.current_quality() == "exact"
        assert accelpatch.current_quality() == "high"
    assert accelpatch.current_quality() == "lossless" and requested_tier() is None


def test_exception_inside_a_block_restores_the_tier():
    with pytest.raises(KeyError):
        with accelpatch.quality("high"):
            with accelpatch.quality("exact"):
                raise KeyError("boom")
    assert accelpatch.current_quality() == "lossless"


def test_model_default_applies_only_outside_blocks():
    assert effective_tier(Tier.HIGH) is Tier.HIGH
    with accelpatch.quality("exact"):
        assert effective_tier(Tier.HIGH) is Tier.EXACT


def test_threads_each_see_their_own_tier():
    barrier = threading.Barrier(3)
    seen = {}

    def worker(name):
        with accelpatch.quality(name):
            barrier.wait()
            seen[name] = accelpatch.current_quality()
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("exact", "lossless", "high")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"exact": "exact", "lossless": "lossless", "high": "high"}


def test_asyncio_tasks_each_see_their_own_tier():
    async def task(name):
        with accelpatch.quality(name):
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return accelpatch.current_quality()

    async def main():
        return await asyncio.gather(task("exact"), task("high"), task("lossless"))

    assert asyncio.run(main()) == ["exact", "high", "lossless"]
