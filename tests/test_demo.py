"""The demo runs end to end offline and tells the truth: fallbacks are labelled with their reason, timing differences
inside the noise read as noise, the MiniMax-H3 sol_attn section shows a fast path that runs on CPU, Wan,
HunyuanVideo 1.5 and LTX-2 have sections of their own, the header prints before the first section and every section
says how long it took."""
import dataclasses
import re

import pytest
import torch

from accelpatch.__main__ import build_parser, main
from accelpatch.core.reporting import ModelReport, Report, SiteReport
from accelpatch.tools import demo, demo_rows, demo_sections
from accelpatch.tools.demo import run_demo
from accelpatch.models.families import families
from accelpatch.tools.demo_rows import fast_path_text, format_timing
from accelpatch.tools.demo_sections import parse_models
from accelpatch.eval.stats import compare_timings

ROW = re.compile(r"^(?P<label>\S.*?)\s{2,}(?P<seconds>\d+\.\d{4})\s{2}(?P<timing>\S.*?)\s{2,}(?P<identical>yes|no)"
                 r"\s+(?P<psnr>inf|\d+\.\d dB)\s+(?P<ssim>\d\.\d{4})\s{2}(?P<fast>.+)$")
NOISE = re.compile(r"^noise \((?P<low>\d+\.\d\d)–(?P<high>\d+\.\d\d)×\)$")
RATIO = re.compile(r"^(?P<ratio>\d+\.\d\d)× (?P<word>faster|slower) \((?P<low>\d+\.\d\d)–(?P<high>\d+\.\d\d)×\)$")
SECTION_TIME = re.compile(r"^-- (?P<title>.+): (?P<wall>\d+\.\d) s wall, (?P<cpu>\d+\.\d) s CPU \(build, calls and "
                          r"scoring\)$")
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the demo says where CUDA is missing")


def section(text, title):
    """The lines of one section (from its '== title:' header to the next header)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"== {title}:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("== ")), len(lines))
    return lines[start:end]


def table(lines):
    """{label: row match} of a section's table."""
    rows = {}
    for line in lines:
        match = ROW.match(line)
        if match:
            rows[match["label"]] = match
    return rows


def assert_timing_is_honest(cell):
    """A ratio only with an interval that excludes 1; otherwise 'noise (lo–hi×)' with 1 inside, or no verdict."""
    if cell in ("baseline", "not timed (1 call)") or cell.startswith("no verdict ("):
        return
    noise, ratio = NOISE.match(cell), RATIO.match(cell)
    assert noise or ratio, cell
    low, high = float((noise or ratio)["low"]), float((noise or ratio)["high"])
    if noise:
        assert low <= 1.0 <= high, cell
    else:
        assert not low <= 1.0 <= high, cell
        assert float(ratio["low"]) <= float(ratio["ratio"]) <= float(ratio["high"]) and float(ratio["low"]) > 1.0, cell


@CPU_ONLY
def test_sana_video_tiers_on_cpu_label_the_fallback_and_time_in_rounds():
    text = run_demo(model="sana-video", steps=1, dtype="fp32", repeats=5, progress=False)
    lines = section(text, "SANA-Video")
    assert "5 interleaved rounds" in lines[0]
    rows = table(lines)
    assert list(rows) == ["unpatched", "patched, default", "patched, exact", "patched, lossless", "patched, high"]
    for label, row in rows.items():
        assert (row["identical"], row["psnr"], row["ssim"]) == ("yes", "inf", "1.0000"), row.group(0)
        assert_timing_is_honest(row["timing"])
    assert rows["unpatched"]["timing"] == "baseline"
    # quality("exact") runs nothing of accelpatch; the default and lossless tiers run the bit-exact fused ops (the
    # block and attn1 sites of both blocks; GLUMB declines float32) and never the high path
    assert rows["patched, exact"]["fast"] == \
        "0, by design: tier exact does not admit lossless; tier exact does not admit high"
    for label in ("patched, default", "patched, lossless"):
        assert rows[label]["fast"] == "0, by design: tier lossless does not admit high; 4 lossless fused calls"
    # on CPU the high path falls back, said with its reason; the lossless sites below it still run
    assert re.fullmatch(r"0, fell back: CUDA is unavailable[^;]*; 4 lossless fused calls", rows["patched, high"]["fast"]), \
        rows["patched, high"][0]
    # the report printed after the table shows what ran at the default tier, fused op by fused op
    assert any(line.startswith("  lossless fusions (bit-exact;") for line in lines), lines
    for op, fused in (("modulate", 4), ("gated_residual", 4), ("relu_rope_pair", 2)):
        assert any(line.strip().startswith(f"{op} on ") and f": {fused} ran;" in line for line in lines), (op, lines)
    assert lines[-2].startswith("after accelpatch.remove(pipe): bit-identical to unpatched: yes (")
    assert SECTION_TIME.match(lines[-1]) and SECTION_TIME.match(lines[-1])["title"] == "SANA-Video", lines[-1]


def test_minimax_h3_section_runs_the_sparse_path_and_stays_bit_identical_where_it_must(monkeypatch):
    # 128x128 keeps the test short; its 592 video rows still leave blocks beyond the sink to skip.
    monkeypatch.setattr(demo_sections, "H3_CALL_SIZE", {"height": 128, "width": 128, "num_frames": 124})
    text = run_demo(model="minimax-h3", steps=1, repeats=2, progress=False)
    lines = section(text, "MiniMax-H3")
    assert "packed sequence 1,011 rows: 5 text + 414 audio (the always-exact sink) + 592 video" in text
    assert 'accelpatch.apply(pipe, backend="sol_attn", dense_steps=0, dense_layers=\'\', min_tokens=0)' in text
    rows = table(lines)
    assert list(rows) == ["unpatched", "sol_attn (high)", "sol_attn, lossless"]
    sol, lossless = rows["sol_attn (high)"], rows["sol_attn, lossless"]
    # 4 sparse layers x 1 step; the 4 fused blocks run their lossless ops beside them
    fast = re.fullmatch(r"(\d+) fast calls, mean exact-block fraction (0\.\d\d); 4 lossless fused calls", sol["fast"])
    assert fast and int(fast[1]) == 4 and 0.0 < float(fast[2]) < 1.0, sol.group(0)
    assert sol["identical"] == "no" and sol["psnr"] != "inf"
    assert (lossless["identical"], lossless["psnr"]) == ("yes", "inf")
    # under quality("lossless") Sol-Attn declines and hands each call to the fused attention site below it
    assert lossless["fast"] == "0, by design: tier lossless does not admit high; 8 lossless fused calls"
    assert lossless["timing"] == "not timed (1 call)"
    # Two rounds cannot give a 95% interval: no speed verdict at all, rather than a bare ratio.
    assert sol["timing"] == f"no verdict (2 < {demo_rows.MIN_ROUNDS} rounds)"
    assert f"Sol-Attn speed: no verdict from 2 round(s)" in text
    assert 'quality("lossless") under sol_attn: bit-identical to unpatched: yes' in text
    assert lines[-2] == "after accelpatch.remove(pipe): bit-identical to unpatched: yes (1 call after remove())"
    assert SECTION_TIME.match(lines[-1]), lines[-1]


def test_timing_inside_the_noise_never_prints_a_bare_ratio():
    same = compare_timings([1.00, 1.04, 0.97, 1.02, 0.99, 1.01], [1.01, 0.98, 1.03, 0.99, 1.02, 1.00])
    assert not same.distinguishable
    cell = format_timing(same, rounds=6)
    assert NOISE.match(cell) and "faster" not in cell and "slower" not in cell, cell
    assert_timing_is_honest(cell)

    faster = compare_timings([2.0, 2.1, 1.9, 2.05, 1.95, 2.0], [1.0, 1.02, 0.98, 1.01, 0.99, 1.0])
    cell = format_timing(faster, rounds=6)
    assert RATIO.match(cell) and cell.startswith("2.00× faster (") and faster.distinguishable, cell
    slower = compare_timings([1.0, 1.02, 0.98, 1.01, 0.99, 1.0], [2.0, 2.1, 1.9, 2.05, 1.95, 2.0])
    assert format_timing(slower, rounds=6).startswith("2.00× slower (")  # never "0.50× slower"
    # Too few rounds for an interval: no verdict, even for a large difference.
    few = demo_rows.MIN_ROUNDS - 1
    assert format_timing(faster, rounds=few) == f"no verdict ({few} < {demo_rows.MIN_ROUNDS} rounds)"
    assert format_timing(None, rounds=6) == "baseline"


def _report(**site):
    defaults = dict(path="blocks.0.attn", kind="k", tier="high", mounted=True, reason=None, fast_calls=0,
                    reference_calls={}, fallback_calls={})
    site = SiteReport(**{**defaults, **site})
    return Report(models=(ModelReport(model_class="M", family="F", backend=None, default_tier="lossless",
                                      strict=False, sites=(site,)),))


def test_fast_path_cell_explains_zero_fast_calls():
    assert fast_path_text(None) == "- (original diffusers code)"
    fell_back = _report(mounted=False, reason="CUDA is unavailable: no GPU",
                        reference_calls={"not mounted: CUDA is unavailable: no GPU (at blocks.0.attn)": 3},
                        fallback_calls={"not mounted: CUDA is unavailable: no GPU (at blocks.0.attn)": 3})
    assert fast_path_text(fell_back) == "0, fell back: CUDA is unavailable: no GPU"
    by_design = _report(mounted=False, reason="CUDA is unavailable: no GPU",
                        reference_calls={"tier lossless does not admit high": 2})
    assert fast_path_text(by_design) == "0, by design: tier lossless does not admit high"
    sparse = _report(fast_calls=6, stats={"exact_fraction": 0.25})
    assert fast_path_text(sparse) == "6 fast calls, mean exact-block fraction 0.25"


def test_fast_path_cell_counts_lossless_calls_apart_from_the_high_path():
    """Regression (issue #17): the cell summed every site's fast calls, so a high row whose high path fell back on
    CPU read "4 fast calls" (the lossless sites' calls) instead of saying it fell back."""
    high = dict(path="blocks.0.attn", kind="k", tier="high", mounted=False, reason="CUDA is unavailable: no GPU",
                fast_calls=0, reference_calls={"not mounted": 2}, fallback_calls={"not mounted": 2})
    lossless = dict(path="blocks.0.attn", kind="k_fused", tier="lossless", mounted=True, reason=None, fast_calls=2,
                    reference_calls={}, fallback_calls={})
    both = Report(models=(ModelReport(model_class="M", family="F", backend=None, default_tier="lossless",
                                      strict=False, sites=(SiteReport(**high), SiteReport(**lossless))),))
    assert fast_path_text(both) == "0, fell back: CUDA is unavailable: no GPU; 2 lossless fused calls"
    only_lossless = Report(models=(dataclasses.replace(both.models[0], sites=(SiteReport(**lossless),)),))
    assert fast_path_text(only_lossless) == "2 lossless fused calls"


def test_model_option_takes_a_comma_list_and_defaults_to_sana_video_and_minimax_h3():
    assert build_parser().parse_args(["demo"]).model == ("sana-video", "minimax-h3")
    assert parse_models("minimax-h3, sana-video2,minimax-h3") == ("minimax-h3", "sana-video2")
    args = build_parser().parse_args(["demo", "--model", "sana-video2"])
    assert args.model == ("sana-video2",) and args.steps is None and args.repeats is None and args.dtype == "auto"


def test_cli_rejects_a_bad_dtype_and_prints_help(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--dtype", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


@CPU_ONLY
def test_demo_runs_sana_video2_from_the_command_line(capsys):
    # --model sana-video2 reaches the demo; its fast paths need CUDA, so on CPU the high row falls back, labelled
    assert main(["demo", "--model", "sana-video2", "--steps", "1", "--repeats", "1", "--dtype", "fp32",
                 "--no-progress", "--no-videos"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("accelpatch demo: tiny random-weight pipelines built offline; cpu, fp32, 1 thread(s)")
    lines = section(text, "SANA-Video 2.0")
    assert lines[0].startswith("== SANA-Video 2.0: tiny random pipeline, 1 steps")
    rows = table(lines)
    assert list(rows) == ["unpatched", "patched, default", "patched, exact", "patched, lossless", "patched, high"]
    for row in rows.values():
        assert (row["identical"], row["psnr"]) == ("yes", "inf"), row.group(0)
        assert row["timing"] in ("baseline", f"no verdict (1 < {demo_rows.MIN_ROUNDS} rounds)"), row.group(0)
    assert re.fullmatch(r"0, fell back: CUDA is unavailable[^;]*; 24 lossless fused calls", rows["patched, high"]["fast"])
    # the default tier runs the bit-exact fused ops of both blocks' sites, never the high path
    assert rows["patched, default"]["fast"] == "0, by design: tier lossless does not admit high; 24 lossless fused calls"
    assert "  lossless fusions (bit-exact;" in text and "rotary_complex_pair on 8 site(s): 8 ran;" in text
    assert "SanaVideo2Transformer3DModel" in text and "== MiniMax-H3" not in text
    assert lines[-2] == "after accelpatch.remove(pipe): bit-identical to unpatched: yes (1 call after remove())"


def test_cli_rejects_an_unknown_model(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--model", "sana-video3"])
    assert "invalid choice: 'sana-video3'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--model", "sana-video,nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


# Regression tests for issue #30, item 7: the header printed only when the whole demo had finished (minutes on a
# loaded machine), and no section said how long it took.

def _fake_section(title, seen=None, capsys=None):
    """A stand-in for a demo section: records what had been printed when it started."""
    def section(spec, **kwargs):
        if capsys is not None:
            seen.append(capsys.readouterr().out)
        return [f"== {spec.title}: stand-in", "body"]
    return section


def test_the_header_prints_before_the_first_section_starts(monkeypatch, capsys):
    printed_before = []
    monkeypatch.setattr(demo, "sana_section", _fake_section("SANA-Video", printed_before, capsys))
    monkeypatch.setattr("torch.set_num_threads", lambda n: None)
    assert main(["demo", "--model", "sana-video", "--no-progress", "--no-videos"]) == 0
    assert len(printed_before) == 1 and printed_before[0].startswith("accelpatch demo: tiny random-weight pipelines"), \
        printed_before
    assert "== SANA-Video: stand-in" in capsys.readouterr().out  # the section follows, printed once


def test_every_section_ends_with_its_wall_and_cpu_time(monkeypatch):
    monkeypatch.setattr(demo, "sana_section", _fake_section("SANA-Video"))
    chunks = []
    text = run_demo(model="sana-video,sana-video2", progress=False, emit=chunks.append)
    assert text == "\n".join(chunks) and len(chunks) == 4  # header, two sections, the total
    for title in ("SANA-Video", "SANA-Video 2.0"):
        lines = section(text, title)
        assert lines[:2] == [f"== {title}: stand-in", "body"]
        timing = SECTION_TIME.match(lines[2])
        assert timing and timing["title"] == title and float(timing["wall"]) >= 0.0, lines
    total = SECTION_TIME.match(text.splitlines()[-1])
    assert total and total["title"] == "all 2 sections", text


def test_the_minimax_h3_section_runs_one_denoising_step_by_default(monkeypatch):
    """Regression (issue #30, item 7): at 2 steps per call the section took 48 s on an idle 2-core EPYC and 2:44
    under load, most of `make demo`; one step keeps its sequence (where the sparse path pays) and halves the
    transformer's share. Small frames here: the default is what is checked, not the size."""
    monkeypatch.setattr(demo_sections, "H3_CALL_SIZE", {"height": 64, "width": 64, "num_frames": 124})
    forwards = []
    real_timed = demo_rows._timed

    def timed(timer, run):
        out = real_timed(timer, run)
        forwards.append(timer.forwards)
        return out

    monkeypatch.setattr(demo_rows, "_timed", timed)
    text = run_demo(model="minimax-h3", repeats=1, progress=False)
    assert "124 frames, 1 denoising step (num_inference_steps=2: " in section(text, "MiniMax-H3")[0]
    assert forwards == [1, 1, 1], forwards  # one forward per call: unpatched, sol_attn (high), sol_attn lossless


# Regression (issue #30, item 7): Wan, HunyuanVideo 1.5 and LTX-2 had no section, and --model had no `all`.

def test_model_option_names_all_six_families_and_all():
    assert list(demo_sections.MODELS) == [f.cli for f in families()]  # the registry's (tests/test_families.py)
    assert parse_models("all") == tuple(demo_sections.MODELS)
    assert parse_models("ltx2, all") == ("ltx2", *(n for n in demo_sections.MODELS if n != "ltx2"))
    assert build_parser().parse_args(["demo", "--model", "wan,hunyuan-video15"]).model == ("wan", "hunyuan-video15")
    help_text = build_parser()._subparsers._group_actions[0].choices["demo"].format_help()
    assert "all" in help_text and "ltx2" in help_text


#: The smallest calls whose sparse attention still skips blocks (256 video tokens: 4 blocks of 64), ~0.3 s each.
SMALL_CALLS = {"wan": dict(height=128, width=128, num_frames=13), "hunyuan-video15": dict(height=32, width=32),
               "ltx2": dict(height=32, width=32, num_frames=3)}


@pytest.mark.parametrize("name", sorted(SMALL_CALLS))
def test_wan_hunyuan_video15_and_ltx2_sections_run_sol_attn_and_stay_bit_identical_where_they_must(name, monkeypatch):
    import accelpatch

    spec = dataclasses.replace(demo_sections.MODELS[name], call_size=SMALL_CALLS[name])
    monkeypatch.setitem(demo_sections.MODELS, name, spec)
    reports = []
    real_report = accelpatch.report

    def spy(*args, **kwargs):
        reports.append(real_report(*args, **kwargs))
        return reports[-1]

    monkeypatch.setattr(accelpatch, "report", spy)
    text = run_demo(model=name, steps=1, repeats=1, progress=False)
    lines = section(text, spec.title)
    rows = table(lines)
    assert list(rows) == ["unpatched", "sol_attn (high)", "sol_attn, lossless"]
    assert (rows["sol_attn, lossless"]["identical"], rows["sol_attn, lossless"]["psnr"]) == ("yes", "inf")
    # the high row's report (the first patched call): every sparse self-attention site mounted at tier high, and the
    # fast calls the table shows are the report's
    high = reports[0]
    sol = [s for s in high.sites if s.kind.endswith("_sol_attn")]
    assert sol and all(s.mounted and s.tier == "high" for s in sol), sol
    fast = sum(s.fast_calls for s in high.sites if s.tier != "lossless")
    assert fast > 0 and rows["sol_attn (high)"]["fast"].startswith(f"{fast} fast calls, mean exact-block fraction")
    assert rows["sol_attn (high)"]["timing"] == f"no verdict (1 < {demo_rows.MIN_ROUNDS} rounds)"
    both = " (frames and audio)" if name == "ltx2" else ""
    assert f'quality("lossless") under sol_attn: bit-identical to unpatched{both}: yes' in lines
    assert lines[-2] == "after accelpatch.remove(pipe): bit-identical to unpatched: yes (1 call after remove())"
    assert SECTION_TIME.match(lines[-1]) and "video tokens per forward" in lines[1]


def test_the_docs_and_help_give_each_section_its_measured_time(monkeypatch):
    """Regression (issue #30, item 7): the README said the demo takes "about a minute" (it took 3:54-5:04 on a
    loaded machine); the docs' command-line page (where the README's text moved) and --help now give each section's
    time as measured, and the CPU it was measured on."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    start = page.index("- `python -m accelpatch demo [")
    bullet = " ".join(page[start:page.index("\n- `", start + 1)].split())
    assert "about a minute" not in bullet and "2-core AVX2 AMD EPYC" in bullet
    for name, spec in demo_sections.MODELS.items():
        assert re.search(rf"{re.escape(spec.title)} ~\d+ s", bullet), spec.title
        assert f"`{name}`" in bullet, name
    assert re.search(r"`make demo` takes about \d+ s", bullet) and re.search(r"`--model all` about \d+ min", bullet)
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens ("hunyuan-" / "video15") on a narrow terminal
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["demo"].format_help().split())
    for name in demo_sections.MODELS:
        assert re.search(rf"{re.escape(name)} ~\d+ s", help_text), name
    assert "2-core AVX2 EPYC" in help_text


def test_the_help_states_each_registered_sections_time_from_its_registration(monkeypatch):
    """A family states its demo section's measured time where it registers (DemoSettings.seconds, measured_on):
    --help reads it, so adding a family edits no list in the demo."""
    from accelpatch.models import families as registry

    wan = registry.by_cli("wan")
    slow = dataclasses.replace(wan, demo=dataclasses.replace(wan.demo, seconds=300, measured_on="a test machine"))
    monkeypatch.setitem(registry._FAMILIES, "wan", slow)
    text = demo_sections.default_help()
    assert "wan ~300 s" in text and "(wan: a test machine)" in text
    assert "all ~" in text and "min" in text


def test_the_videos_section_writes_each_trained_familys_tiers_side_by_side_and_names_the_files(tmp_path, capsys):
    """#43 part 3: exact | lossless | high of each trained tiny model as a PNG strip and a GIF, the metrics under
    them, for every family that ships trained, with the setting its package registers (Wan: Sol-Attn, every layer
    sparse; SANA-Video: the step cache at threshold 0.2; SANA-Video 2.0: Sol-Attn on its anchor); lossless is
    bit-identical to exact, high is not, and its numbers say how far."""
    from PIL import Image

    from accelpatch.tools.demo_videos import video_section

    from accelpatch.tiny_models.shipped import shipped_families

    shown = [(f.cli, f.name) for f in families() if f.cli in shipped_families()]  # the registry's order
    assert [cli for cli, _ in shown] == ["sana-video", "sana-video2", "wan"]
    lines = video_section(tmp_path / "videos")
    heads = [i for i, line in enumerate(lines) if line.startswith("== Videos: ")]
    assert [lines[i] for i in heads] == [f"== Videos: the trained tiny {name} under exact | lossless | high, side by "
                                         f"side" for _, name in shown]
    for (family, _), start, end in zip(shown, heads, heads[1:] + [len(lines)]):
        block = lines[start:end]
        png, gif = tmp_path / "videos" / f"{family}-trained.png", tmp_path / "videos" / f"{family}-trained.gif"
        assert block[-2] == f"   strip (one row per tier): {png}", block
        assert block[-1] == f"   animation (the tiers side by side): {gif}", block
        assert "   lossless: bit-identical; motion ratio 1.000, flicker delta +0.0000" in block
        (high,) = [line for line in block if line.startswith("   high: ")]
        assert re.match(r"   high: worst frame SSIM 0\.\d{4}, PSNR [\d.]+ dB; motion ratio [\d.]+, flicker delta "
                        r"[-+]", high), high
        assert Image.open(gif).n_frames == 13 and Image.open(png).size[0] >= 5 * 256
    assert "Loading" not in capsys.readouterr().err  # no loading bars between the demo's lines
