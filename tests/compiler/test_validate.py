"""Cross checks and schema messages: engine option values typed from vLLM's parser, hardware names,
union-typed keys reported once, single-wave loads warned about."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from compiler.engine_options import option_table, value_problem
from compiler.load import check_file
from studyc.cli import main
from tests.variants import study_variant

ROOT = Path(__file__).resolve().parents[2]


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    return study_variant(tmp_path, *edits)


def _messages(path: Path) -> list[str]:
    _, problems = check_file(path)
    return [f"{p.path}: {p.message}" for p in problems]


@pytest.mark.parametrize(("name", "value"), [
    ("kv-cache-memory-bytes", "256M"), ("kv-cache-memory-bytes", 1 << 28), ("kv-cache-memory-bytes", "None"),
    ("max-model-len", "auto"), ("max-model-len", 2048), ("max-model-len", "32k"), ("block-size", 32),
    ("gpu-memory-utilization", 0.9), ("gpu-memory-utilization", 1), ("enforce-eager", False),
    ("compilation-config", {"level": 0}), ("compilation-config", '{"level": 0}'), ("kv-cache-dtype", "fp8"),
    ("served-model-name", ["a", "b"]), ("hf-overrides", {"x": 1}), ("hf-overrides", "text"),
])
def test_engine_values_that_vllm_takes(name: str, value: object) -> None:
    assert value_problem(name, value) is None


@pytest.mark.parametrize(("name", "value", "said"), [
    ("kv-cache-memory-bytes", "lots", "takes a size"), ("kv-cache-memory-bytes", True, "not true/false"),
    ("max-model-len", "long", 'or "auto"'), ("block-size", "big", "takes an integer"),
    ("block-size", 1.5, "takes an integer"), ("gpu-memory-utilization", "most", "takes a number"),
    ("enforce-eager", 1, "takes true or false"), ("enforce-eager", "yes", "takes true or false"),
    ("compilation-config", "level0", "takes a table"), ("kv-cache-dtype", "fp9", "is not one of"),
    ("block-size", [16, 32], "not a list"),
])
def test_engine_values_that_vllm_refuses(name: str, value: object, said: str) -> None:
    problem = value_problem(name, value)
    assert problem is not None and said in problem


def test_option_table_comes_from_vllms_parser() -> None:
    table = option_table()
    assert table["kv-cache-memory-bytes"]["kind"] == "size"
    assert table["enforce-eager"]["kind"] == table["no-enforce-eager"]["kind"] == "bool"
    assert "fp8" in table["kv-cache-dtype"]["choices"]
    assert len(table) > 300


def test_kv_cache_memory_bytes_lots_names_file_line_and_key(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('kv_cache_memory_bytes = "256M"', 'kv_cache_memory_bytes = "lots"'))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"{path}:16: engine.kv_cache_memory_bytes: `--kv-cache-memory-bytes` takes a size")


def test_arm_options_are_typed_too(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('cache = "keep"', 'cache = "keep"\nmax_num_seqs = "many"'))
    assert _messages(path) == ['arms.warm.max_num_seqs: `--max-num-seqs` takes an integer, got "many"']


def test_unknown_hardware_fails_validate_and_plan_without_traceback(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('hardware = "cpu"', 'hardware = "b300"'))
    for command in ("validate", "plan"):
        result = CliRunner().invoke(main, [command, str(path)])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
        assert f"{path}:6: study.hardware: unknown hardware 'b300'; did you mean 'b200'?" in result.output


def test_nvidia_smi_names_are_valid_hardware(tmp_path: Path) -> None:
    assert _messages(_variant(tmp_path, ('hardware = "cpu"', 'hardware = "NVIDIA H200"'))) == []


@pytest.mark.parametrize(("value", "message"), [
    ("-5", "load.requests: should be greater than 0"),
    ("0", "load.requests: should be greater than 0"),
    ('"eight"', "load.requests: should be an integer or a list"),
    ("[8, -1]", "load.requests[1]: should be greater than 0"),
])
def test_union_keys_get_one_plain_message(tmp_path: Path, value: str, message: str) -> None:
    path = _variant(tmp_path, ("requests = 16 ", f"requests = {value} "))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.output == f"{path}:37: {message}\n"
    assert "constrained" not in result.output and "valid list" not in result.output


def test_ratio_side_of_the_wrong_type(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("ratio = [{ concurrency = 4 }, { concurrency = 1 }]", 'ratio = ["cold", 5]'))
    assert _messages(path) == ["hypothesis[0].predict.ratio[1]: should be a string or a table"]


def test_ambiguous_selector_names_the_dimension(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('where = { arm = "warm", concurrency = 4 }', 'where = { concurrency = 4 }'))
    assert _messages(path) == ["hypothesis[2].where: selector matches 2 points; narrow it by arm (cold, warm)"]
    path = _variant(tmp_path, ('where = { arm = "warm", concurrency = 4 }', 'where = { arm = "warm" }'))
    assert _messages(path) == ["hypothesis[2].where: selector matches 2 points; narrow it by concurrency (1, 4)"]


def test_single_wave_closed_loop_warns_but_validates(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("requests = 16 ", "requests = [8, 4] "))
    loaded, problems = check_file(path)
    assert problems == [] and loaded is not None
    assert [(w.path, w.line) for w in loaded.warnings] == [("load.requests[1]", 37)]
    assert "4 requests at concurrency 4 is one wave" in loaded.warnings[0].message
    for command in ("validate", "plan"):
        result = CliRunner().invoke(main, [command, str(path)])
        assert result.exit_code == 0
        assert f"{path}:37: load.requests[1]: warning: 4 requests at concurrency 4 is one wave" in result.stderr


def test_burst_true_silences_the_single_wave_warning(tmp_path: Path) -> None:
    path = _variant(tmp_path, ("requests = 16 ", "requests = 4 "), ('cache = "reset"', 'cache = "reset"\nburst = true'))
    loaded, problems = check_file(path)
    assert problems == [] and loaded is not None and loaded.warnings == ()


def test_steady_state_load_has_no_warning() -> None:
    loaded, _ = check_file(ROOT / "studies/quickstart.toml")
    assert loaded is not None and loaded.warnings == ()


# ---- predictions must evaluate (compiler.predict_resolve) -----------------------------------------------

HIT_RATE = 'predict = { relation = "<", value = 0.01 }'


def test_a_prediction_that_evaluates_is_not_reported(tmp_path: Path) -> None:
    roof = 'predict = { relation = "<", value = "roofline.decode_tokens_per_s(batch=1, context=64)" }'
    assert _messages(_variant(tmp_path, (HIT_RATE, roof))) == []


def test_a_prediction_on_a_model_served_by_name_cannot_be_evaluated(tmp_path: Path) -> None:
    """No local folder: scoring would have no config to evaluate the expression with; a number needs none."""
    path = _variant(tmp_path, (f'path = "{ROOT / "models/tiny-qwen3"}"\n', ""),
                    (HIT_RATE, 'predict = { relation = "<", value = "model.params" }'))
    assert [m for m in _messages(path) if ".predict." in m] == [
        "hypothesis[1].predict.value: the prediction cannot be evaluated on the spec sheet (cpu): arm 'cold' names "
        "no local model folder: expressions need a config.json"]


def test_unknown_hardware_reports_the_card_once_and_still_checks_numbers(tmp_path: Path) -> None:
    path = _variant(tmp_path, ('hardware = "cpu"', 'hardware = "cpuu"'),
                    (HIT_RATE, 'predict = { relation = "<", value = "hw.bandwidth" }'),
                    ("predict = { value = 0.75, tolerance = 0.2 }", "predict = { value = inf, tolerance = 0.2 }"))
    messages = _messages(path)
    assert sum("cannot be evaluated" in m for m in messages) == 1, messages
    assert any(m.endswith("cannot be evaluated on the spec sheet (cpuu): inf is not a finite number") for m in messages)
    assert any(m.startswith("study.hardware: unknown hardware 'cpuu'") for m in messages)
