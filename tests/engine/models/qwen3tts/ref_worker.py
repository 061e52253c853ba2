"""Runs the reference (qwen-tts 0.1.1 on transformers 4.57.3) for the parity tests, in its own process.

The reference pins transformers 4.57.x, the project runs 5.x (VoxCPM's reference needs it), so the reference
lives in a side directory (scripts/setup.sh --test installs it there) that only this process puts first on
sys.path. Usage: `python ref_worker.py JOBS.pt OUT.pt`; JOBS is a list of dicts, OUT the list of results.

`qwen_tts` imports its 25 Hz tokenizer stack at import time, which needs `torchaudio` (no CPU wheel for this
torch), the `sox` binding and onnxruntime; none runs on the 12 Hz path, so those missing are stubbed by empty
modules here.
transformers is imported first: it probes for torchaudio and must see the truth.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import torch
import transformers  # noqa: F401

STUBS = {"torchaudio": ("torchaudio.compliance", "torchaudio.compliance.kaldi"), "sox": (), "onnxruntime": ()}
for _top, _subs in STUBS.items():
    if importlib.util.find_spec(_top) is None:
        for _name in (_top, *_subs):
            sys.modules[_name] = types.ModuleType(_name)
            # torch._dynamo probes optional modules with find_spec, which needs a spec on anything in sys.modules
            sys.modules[_name].__spec__ = importlib.machinery.ModuleSpec(_name, None)

from qwen_tts import Qwen3TTSModel  # noqa: E402

_models: dict[str, Qwen3TTSModel] = {}


def _model(path: str) -> Qwen3TTSModel:
    if path not in _models:
        _models[path] = Qwen3TTSModel.from_pretrained(path, device_map="cpu", dtype=torch.float32)
    return _models[path]


def _sampling(job: dict) -> dict:
    greedy = job.get("greedy", True)
    return {"do_sample": not greedy, "subtalker_dosample": not greedy, "max_new_tokens": job["max_new_tokens"]}


def generate(job: dict) -> dict:
    """One batch through the reference's generate_* of the variant; codes [T, 16] per item and the waveforms."""
    m = _model(job["checkpoint"])
    captured: list = []
    inner = m.model.generate

    def spy(*args, **kwargs):
        codes, hiddens = inner(*args, **kwargs)
        captured.append(codes)
        return codes, hiddens

    m.model.generate = spy
    if "seed" in job:
        torch.manual_seed(job["seed"])
    items = job["items"]
    common = {"text": [i["text"] for i in items], "language": [i.get("language", "auto") for i in items]}
    if "non_streaming" in job:
        common["non_streaming_mode"] = job["non_streaming"]
    kind = job["kind"]
    prompt_items = None
    if kind == "custom_voice":
        instructs = [i.get("instruct") or "" for i in items]
        wavs, sr = m.generate_custom_voice(
            speaker=[i["speaker"] for i in items], instruct=instructs, **common, **_sampling(job)
        )
    elif kind == "voice_design":
        wavs, sr = m.generate_voice_design(instruct=[i["instruct"] for i in items], **common, **_sampling(job))
    else:
        prompt_items = m.create_voice_clone_prompt(
            ref_audio=[(i["ref_audio"], 24000) for i in items],
            ref_text=[i.get("ref_text") for i in items],
            x_vector_only_mode=[i.get("x_vector_only", False) for i in items],
        )
        wavs, sr = m.generate_voice_clone(voice_clone_prompt=prompt_items, **common, **_sampling(job))
    m.model.generate = inner
    out = {"codes": [c.clone() for c in captured[0]], "wavs": [torch.from_numpy(w.copy()) for w in wavs], "sr": sr}
    if prompt_items is not None:
        out["ref_codes"] = [p.ref_code for p in prompt_items]
        out["speaker_vectors"] = [p.ref_spk_embedding for p in prompt_items]
    return out


def decode(job: dict) -> dict:
    m = _model(job["checkpoint"])
    wavs, _ = m.model.speech_tokenizer.decode([{"audio_codes": c} for c in job["codes"]])
    return {"wavs": [torch.from_numpy(w.copy()) for w in wavs]}


def tokenize(job: dict) -> dict:
    m = _model(job["checkpoint"])
    return {"ids": [m._tokenize_texts([t])[0][0].tolist() for t in job["texts"]]}


def layout(job: dict) -> dict:
    """Names and shapes of every tensor the reference's modules hold for a checkpoint's configs."""
    m = _model(job["checkpoint"])
    return {
        "model": {k: tuple(v.shape) for k, v in m.model.state_dict().items()},
        "codec": {k: tuple(v.shape) for k, v in m.model.speech_tokenizer.model.state_dict().items()},
    }


def main() -> None:
    jobs = torch.load(sys.argv[1], weights_only=False)
    handlers = {"generate": generate, "decode": decode, "tokenize": tokenize, "layout": layout}
    torch.save([handlers[job["op"]](job) for job in jobs], sys.argv[2])


if __name__ == "__main__":
    main()
