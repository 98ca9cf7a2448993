"""A trained checkpoint out as a plain Hugging Face model: same weights, same logprobs, same chat
template; serve and eval take run directories and exported ones."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.cli import main
from flowgrpo.runs.export import export_checkpoint, load_served_policy
from tests.toy import make_trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()  # (1, T, V)
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]  # (T-1,)


@pytest.fixture
def trained(tmp_path):
    tr = make_trainer(tmp_path, "model.name=tiny", "train.steps=2", "run.save_every=1")
    tr.train()
    return tr


def test_export_loads_in_transformers_with_the_same_logprobs_and_template(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export_checkpoint(trained.out, tmp_path / "exported")
    assert (out / "model.safetensors").is_file() and (out / "flowgrpo.yaml").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "What is 12 + 7?"}]
    text = trained.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == text
    ids = trained.tokenizer(text)["input_ids"] + [5, 17, 42]
    trained.model.eval()
    assert torch.equal(logprobs(model, ids), logprobs(trained.model, ids))


def test_an_older_step_exports_its_own_weights(trained, tmp_path):
    a = load_served_policy(str(trained.out), step=1)[0]
    b = load_served_policy(str(trained.out))[0]  # the latest: step 2
    assert any(
        not torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert all(
        torch.equal(x, y)
        for x, y in zip(b.state_dict().values(), trained.model.state_dict().values(), strict=True)
    )


def test_cli_export_then_eval_the_exported_directory(trained, tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["export", str(trained.out), str(out), "--step", "1"]) == 0
    assert "from_pretrained" in capsys.readouterr().out
    # the exported flowgrpo.yaml points at the export; the env and reward are overridden here
    over = ["--set", "env.name=arithmetic", "--set", "rewards=[{name: accuracy}]"]
    over += ["--set", "rollout.max_new_tokens=4", "--set", "rollout.max_turns=1"]
    assert main(["eval", str(out), "--n", "2", "--json", *over]) == 0
    assert '"n":2' in capsys.readouterr().out.replace(" ", "")


def test_a_hub_id_is_one_line_saying_how_to_point_at_a_local_directory(capsys):
    assert main(["serve", "--model", "HuggingFaceTB/SmolLM2-360M-Instruct"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--local-dir" in err and "never downloads" in err


@pytest.mark.slow
def test_export_of_the_embedded_model_gives_the_same_logprobs(tmp_path):
    from transformers import AutoModelForCausalLM

    from flowgrpo.config import dump_config, load_config
    from flowgrpo.modeling.models import load_model
    from flowgrpo.runs.checkpoint import save_checkpoint

    run = tmp_path / "run"
    cfg = load_config(None, [f"run.output_dir={run}", "model.name=smollm2-135m"])
    dump_config(cfg, (run.mkdir() or run) / "config.yaml")
    model, tok = load_model("smollm2-135m")
    with torch.no_grad():
        model.model.norm.weight.mul_(1.05)  # a "trained" policy that differs from the base
    save_checkpoint(run / "checkpoints", 1, model=model)
    out = export_checkpoint(run, tmp_path / "exported")
    exported = AutoModelForCausalLM.from_pretrained(out)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text)["input_ids"]
    model.eval()
    assert torch.equal(logprobs(exported, ids), logprobs(model, ids))
