"""``stage=decode``: the PNGs of a run written again from its records, byte for byte the generate stage's, resumably."""

from __future__ import annotations

import pytest

from csd.decode import decode_run, decode_runs
from csd.pipeline import generate_run
from csd.records import load_records
from tests.evaluation.test_eval_fixtures import make_run
from tests.pipeline.test_integrity import exit_line, stage_cfg
from tests.pipeline.test_rundir import tiny_cfg


def test_decode_stage_writes_the_pngs_the_run_wrote_byte_for_byte_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    generate_run(tiny_cfg(run))  # janus_pro_tiny: a real VQ decoder, 3 images
    records = load_records(run)
    wrote = {r["image"]: (run / r["image"]).read_bytes() for r in records}
    (run / records[0]["image"]).unlink()
    broken = run / records[1]["image"]
    broken.write_bytes(wrote[records[1]["image"]][:60])
    kept = run / records[2]["image"]
    inode = kept.stat().st_ino

    from csd.cli import run_stages

    run_stages(stage_cfg("decode", tmp_path, run_dir=str(run)))
    assert "decode: 2 images written, 1 already there (1 run in" in capsys.readouterr().out
    assert {name: (run / name).read_bytes() for name in wrote} == wrote
    assert kept.stat().st_ino == inode  # a PNG with the right bytes is left alone
    again = decode_run(run, progress=False)
    assert (again.written, again.kept) == (0, 3)
    assert sorted(p.name for p in (run / "images").iterdir()) == sorted(n.split("/")[1] for n in wrote)  # no temp files


def test_decode_stage_replaces_a_png_that_is_not_the_decode(tmp_path):
    run = tmp_path / "run"
    generate_run(tiny_cfg(run))
    png = run / load_records(run)[0]["image"]
    wrote = png.read_bytes()
    from PIL import Image

    with Image.open(png) as image:
        image.save(png, compress_level=0)  # the same pixels, other bytes
    assert png.read_bytes() != wrote
    assert decode_run(run, progress=False).written == 1
    assert png.read_bytes() == wrote


def toy_shaped_run(run_dir, n_images: int = 2):
    """A made-up run the toy model can decode (16 x 16 tokens of its 256 codes), its PNGs removed."""
    run = make_run(run_dir, "csd", n_images=n_images, grid=(16, 16), method_params={"lam": 0.5, "delta": 0.3},
                   tokens=[[(p + 7 * i) % 256 for p in range(256)] for i in range(n_images)])
    for png in (run / "images").iterdir():
        png.unlink()
    return run


def test_decode_stage_over_a_sweep_decodes_every_run(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    runs = [toy_shaped_run(sweep / name) for name in ("0_csd", "1_csd")]
    (sweep / "report").mkdir()
    from csd.cli import run_stages

    # run.py's run_dir for a sweep: Hydra's own directory, runs/decode/<time>
    run_stages(stage_cfg("decode", tmp_path, sweep_dir=str(sweep), run_dir=str(tmp_path / "hydra")))
    assert "decode: 4 images written, 0 already there (2 runs in" in capsys.readouterr().out
    assert all(len(list((run / "images").glob("*.png"))) == 2 for run in runs)
    assert [(d.written, d.kept) for d in decode_runs(sweep, progress=False)] == [(0, 2), (0, 2)]


@pytest.mark.parametrize(("keys", "message"), [
    ({"run_dir": "empty"}, "is not a generated run directory and holds none (no run.json)"),
    ({"sweep_dir": "empty", "run_dir": "hydra"}, "is not a generated run directory and holds none (no run.json)"),
    ({"sweep_dir": "gone", "run_dir": "hydra"}, "does not exist"),
])
def test_decode_stage_refuses_a_directory_without_runs_in_one_line(tmp_path, capsys, keys, message):
    (tmp_path / "empty").mkdir()
    keys = {k: str(tmp_path / v) for k, v in keys.items()}
    assert message in exit_line(stage_cfg("decode", tmp_path, **keys), capsys)


def test_decode_stage_needs_a_directory():
    from csd.cli import check_dirs
    from csd.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^stage=decode needs sweep_dir=<dir> or run_dir=<dir>$"):
        check_dirs("decode", None, None)
