"""Judging a config.json against the engine rules of :mod:`.engines`: one verdict per engine."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from ..rope_math import yarn_mscale
from .config_json import ConfigJSON, RopeDict
from .engines import (
    APPROXIMATES,
    CANNOT,
    DEFAULT_THETA,
    ENGINES,
    FAILS,
    FIELD_DEFAULTS,
    KEEPS,
    LONGROPE_LEN,
    LOSES,
    NON_NATIVE_PREFIX,
    PROVENANCE_KEY,
    READERS,
    Engine,
    engine_context,
    flat_rope,
    original_context,
)
from .gguf_support import carry
from .legacy import FIELDS


@dataclass(frozen=True)
class EngineVerdict:
    engine: str
    name: str
    versions: str
    verdict: str
    why: str


class EngineVerdictJSON(TypedDict):
    """:class:`EngineVerdict` as ``doctor --json`` writes it (``dataclasses.asdict``)."""

    engine: str
    name: str
    versions: str
    verdict: str
    why: str


class ReportJSON(TypedDict):
    """:meth:`Report.to_json`: the intended scaling, whether every engine keeps it, and each verdict."""

    source: str
    method: str
    scaled: bool
    note: str | None
    ok: bool
    engines: list[EngineVerdictJSON]


@dataclass(frozen=True)
class Report:
    """What :func:`check` found: the intended scaling and one verdict per engine."""

    source: str
    method: str
    scaled: bool
    verdicts: list[EngineVerdict]
    note: str | None = None  # one line for scalings no engine but ropescale reproduces

    @property
    def loses(self) -> list[EngineVerdict]:
        return [v for v in self.verdicts if v.verdict == LOSES]

    @property
    def fails(self) -> list[EngineVerdict]:
        return [v for v in self.verdicts if v.verdict == FAILS]

    def to_json(self) -> ReportJSON:
        return {
            "source": self.source,
            "method": self.method,
            "scaled": self.scaled,
            "note": self.note,
            "ok": not self.loses and not self.fails,
            "engines": [asdict(v) for v in self.verdicts],
        }


# --- readers: config.json dict -> (the rope dict the engine builds from, with rope_theta and the
# original context filled in as it fills them; a description of where it read it) ---------------


@dataclass(frozen=True)
class Intent:
    rope: RopeDict  # the rope dict as ropescale / transformers 5 build the model from it
    method: str
    native: bool
    attention_mode: str | None
    original_theta: float
    extended: int | None = None  # the context the scaling covers (ropescale's block), None: unknown


def intent_of(data: dict) -> Intent:
    """The scaling a config.json means.

    Args:
        data: the parsed config.json.

    Returns:
        An :class:`Intent` from ``rope_parameters`` and ropescale's provenance block (method,
        native, KV-consistent mode, original base); from the legacy keys when there is no
        ``rope_parameters`` (a checkpoint of transformers 4).
    """
    block = data.get(PROVENANCE_KEY) if isinstance(data.get(PROVENANCE_KEY), dict) else {}
    rope = flat_rope(data.get("rope_parameters")) or flat_rope(data.get("rope_scaling")) or {"rope_type": "default"}
    rope.setdefault("rope_theta", data.get("rope_theta", DEFAULT_THETA))
    original_context(rope, data, top_wins=False)
    if rope["rope_type"] in ("yarn", "llama3", "longrope"):
        rope.setdefault("original_max_position_embeddings", data.get("max_position_embeddings"))
    rope_type = str(rope["rope_type"])
    native = (
        bool(block.get("native", True))
        and not rope_type.startswith(NON_NATIVE_PREFIX)
        and not str(data.get("model_type", "")).startswith(NON_NATIVE_PREFIX)
    )
    attention = None
    if block.get("method") == "self_extend":
        attention = "self_extend"
    elif block.get("kv_consistent"):
        attention = "kv_consistent"
    method = _attention_composed(block) or block.get("method") or rope_type
    original = float(block.get("original_rope_theta", rope["rope_theta"]))
    extended = block.get("extended_context")
    return Intent(rope, method, native, attention, original, int(extended) if extended else None)


#: the attention-level methods (``ropescale.methods.composed.ATTENTION_ON_TOP``; no torch here)
_ATTENTION_METHODS = ("self_extend", "dca", "string", "self_extend_llamacpp")


def _attention_composed(block: dict) -> str | None:
    """``self_extend x2 on llama3 x8 (composed)`` for an attention-level method composed on a shipped scaling
    (a provenance block's ``composed`` with such an ``on_top``), so that a verdict names what cannot be
    expressed rather than "composed" (a composed frequency method is saved as LongRoPE and engines read it)."""
    params = block.get("params") if block.get("method") == "composed" else None
    on_top, base = (params or {}).get("on_top"), (params or {}).get("base")
    if not isinstance(on_top, dict) or not isinstance(base, dict) or on_top.get("method") not in _ATTENTION_METHODS:
        return None
    shipped = (base.get("params") or {}).get("factor")
    return (
        f"{on_top['method']} x{float(params.get('factor') or 1):g} on the shipped {base.get('method')}"
        + (f" x{float(shipped):g}" if shipped else "")
        + " (composed)"
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _context_free_longrope(rope: dict) -> bool:
    """LongRoPE whose frequencies and attention factor do not depend on the original context L: equal short
    and long factors (nothing switches at L) and an explicit attention factor (not derived from L), as a
    composed scaling is saved (:mod:`ropescale.methods.composed`)."""
    return (
        rope.get("rope_type") == "longrope"
        and rope.get("short_factor") == rope.get("long_factor")
        and rope.get("attention_factor") is not None
    )


def _mismatch(seen: dict, want: dict) -> str | None:
    """The first field the engine reads differently, as 'field a instead of b'."""
    if seen["rope_type"] != want["rope_type"]:
        return f"rope type {seen['rope_type']!r} instead of {want['rope_type']!r}"
    if not _same(seen["rope_theta"], want["rope_theta"]):
        return f"rope_theta {seen['rope_theta']:g} instead of {want['rope_theta']:g}"
    for key in FIELDS.get(want["rope_type"], ()):
        if key == "original_max_position_embeddings" and _context_free_longrope(want):
            continue  # equal factors and a pinned attention factor: L changes nothing a loader computes
        a, b = seen.get(key, FIELD_DEFAULTS.get(key)), want.get(key, FIELD_DEFAULTS.get(key))
        if not _same(a, b):
            return f"{key} {a!r} instead of {b!r}"
    return None


def _param_caveats(engine: Engine, rope: dict, data: dict) -> tuple[str, str] | None:
    """Engine quirks that depend on the method's parameters, not just its type."""
    kind = rope["rope_type"]
    if engine.key == "tgi" and kind == "yarn":
        custom = [k for k in ("attention_factor",) if rope.get(k) is not None]
        custom += [
            k for k in ("beta_fast", "beta_slow") if not _same(rope.get(k, FIELD_DEFAULTS[k]), FIELD_DEFAULTS[k])
        ]
        if custom:
            return APPROXIMATES, (
                f"TGI fixes beta_fast=32, beta_slow=1 and ignores attention_factor ({', '.join(custom)} set)"
            )
    if engine.key == "tgi" and kind == "longrope" and "original_max_position_embeddings" not in data:
        return FAILS, "TGI longrope reads the top-level original_max_position_embeddings (absent: AttributeError)"
    if (
        engine.key == "transformers4"
        and kind == "llama3"
        and not (data.get("rope_scaling") or {}).get("original_max_position_embeddings")
    ):
        return FAILS, "4.x llama3 requires rope_scaling.original_max_position_embeddings (KeyError)"
    return None


def _serving_caveat(engine: Engine, seen: dict, data: dict, intent: Intent) -> tuple[str, str] | None:
    """vLLM/SGLang: YaRN's attention factor read as ``attn_factor``; a default context the scaling
    does not cover (they multiply max_position_embeddings by the factor)."""
    want = intent.rope.get("attention_factor")
    if engine.attn_factor and seen["rope_type"] == "yarn" and want is not None and "mscale" not in seen:
        got = yarn_mscale(float(seen.get("factor", 1))) * float(seen.get("attn_factor", 1.0))
        if not _same(round(got, 9), round(float(want), 9)):
            return APPROXIMATES, (
                f"reads attn_factor (a multiplier of 0.1 ln(factor) + 1), not attention_factor: cos/sin scaled by "
                f"{got:.4g} instead of {float(want):.4g} (re-save with ropescale)"
            )
    context = engine_context(engine, seen, data)
    if context is not None and intent.extended is not None and context != intent.extended:
        more = f"; prompts beyond {intent.extended} run outside the scaling" if context > intent.extended else ""
        return APPROXIMATES, f"serves {context} tokens by default, the scaling covers {intent.extended}{more}"
    return None


def _vllm_dca(data: dict) -> str:
    """What vLLM does with a DCA checkpoint: Qwen2-family models read ``dual_chunk_attention_config``."""
    dca = data.get("dual_chunk_attention_config")
    model_type = str(data.get("model_type", "")).removeprefix(NON_NATIVE_PREFIX)
    if not isinstance(dca, dict):
        return (
            f"vLLM runs dual chunk attention only in Qwen2-family models (dual_chunk_attention_config): "
            f"DCA on {model_type} is ropescale's alone"
        )
    return (
        f"vLLM 0.9-0.10 (V0 engine, CUDA, DUAL_CHUNK_FLASH_ATTN) ran Qwen2-family DCA from the "
        f"dual_chunk_attention_config written here (chunk_size {dca.get('chunk_size')}, local_size "
        f"{dca.get('local_size')}: ropescale's positions); vLLM >= 0.11 removed that backend "
        f"(vllm-project/vllm#25351), and the config is marked {data.get('model_type')} so that plain loaders stop"
    )


def judge(engine: Engine, data: dict, intent: Intent) -> EngineVerdict:
    """One engine's verdict on one config.json dict.

    Args:
        engine: the row of :data:`ENGINES`.
        data: the parsed config.json.
        intent: :func:`intent_of` ``data``.

    Returns:
        A :class:`EngineVerdict`: ``loses`` when what the engine reads (its reader) differs from the
        intended scaling, else the engine's own support for that rope type and parameters.
    """

    def verdict(kind: str, why: str) -> EngineVerdict:
        return EngineVerdict(engine.key, engine.name, engine.versions, kind, why)

    if engine.reader == "gguf":  # the answer export-gguf refuses by
        answer = carry(data, intent)
        return verdict(answer.verdict, answer.why)
    if not intent.native and intent.method == "dca" and engine.name == "vLLM":
        return verdict(CANNOT, _vllm_dca(data))
    if not intent.native:
        return verdict(
            CANNOT,
            f"needs ropescale: {intent.method} is not expressible in config.json "
            f"(model_type {data.get('model_type')!r} stops plain loaders)",
        )
    seen, where = READERS[engine.reader](data)
    caveat = _param_caveats(engine, seen, data)
    if caveat is not None and caveat[0] == FAILS:
        return verdict(*caveat)
    problem = _mismatch(seen, intent.rope)
    if problem is not None:
        return verdict(LOSES, f"reads {where}: {problem}")
    kind, why = engine.support.get(seen["rope_type"], (KEEPS, f"reads {where}"))
    if kind == APPROXIMATES and why == LONGROPE_LEN and seen.get("short_factor") == seen.get("long_factor"):
        # long_factor at every length is exact when it equals short_factor; the engines that switch by
        # position (> L, not >= L) still read position L from the wrong table, equal factors or not
        kind, why = KEEPS, f"reads {where} (short_factor = long_factor: nothing switches at L)"
    if caveat is not None and kind == KEEPS:
        kind, why = caveat
    if kind == KEEPS:
        kind, why = _serving_caveat(engine, seen, data, intent) or (kind, why)
    if intent.attention_mode == "kv_consistent" and kind in (KEEPS, APPROXIMATES):
        extra = f"; {why}" if kind == APPROXIMATES else ""
        return verdict(CANNOT, f"plain {intent.method} without KV-consistent rotation{extra}")
    return verdict(kind, why)


def check(data: dict, source: str = "config.json", engines: tuple[Engine, ...] = ENGINES) -> Report:
    """Verdicts of every engine on a config.json dict.

    Args:
        data: the parsed config.json.
        source: what it was read from (shown in the report).
        engines: the rows to judge (default: all of :data:`ENGINES`).

    Returns:
        A :class:`Report`; ``report.loses`` lists the engines that would silently drop the scaling.
    """
    intent = intent_of(data)
    scaled = (
        intent.rope["rope_type"] != "default"
        or not _same(intent.rope["rope_theta"], intent.original_theta)
        or not intent.native
        or intent.attention_mode is not None
    )
    verdicts = [judge(e, data, intent) for e in engines]
    verdicts.append(
        EngineVerdict("ropescale", "ropescale", "this version", KEEPS, "reads rope_parameters and its own block")
    )
    return Report(source, intent.method, scaled, verdicts, outside_note(intent) or engine_note(intent, verdicts))


def outside_note(intent: Intent) -> str | None:
    """One line for a scaling no engine but ropescale reproduces.

    Args:
        intent: from :func:`intent_of`.

    Returns:
        What other loaders do with it instead (save_pretrained warns it), or None.
    """
    if not intent.native:
        return (
            f"{intent.method} cannot be expressed outside ropescale: plain transformers/vLLM stop at the "
            "config; load it with ropescale.from_pretrained (or trust_remote_code=True)"
        )
    if intent.attention_mode == "kv_consistent":
        return (
            f"{intent.method} with KV-consistent rotation cannot be expressed outside ropescale: "
            f"transformers/vLLM load it as plain {intent.method}, whose cached keys keep the frequencies they were "
            "rotated with"
        )
    return None


def engine_note(intent: Intent, verdicts: list[EngineVerdict]) -> str | None:
    """One line for dynamic NTK / LongRoPE, which no config.json makes vLLM and SGLang serve as
    transformers does: the engines, their versions and what they do (save_pretrained warns it)."""
    if intent.rope["rope_type"] not in ("dynamic", "longrope"):
        return None
    groups: dict[str, list[str]] = {}
    for v in verdicts:
        if v.name in ("vLLM", "SGLang") and v.verdict in (FAILS, APPROXIMATES):
            groups.setdefault(f"{v.verdict}: {v.why}", []).append(f"{v.name} {v.versions}")
    if not groups:
        return None
    parts = [f"{', '.join(names)} {what}" for what, names in groups.items()]
    return f"{intent.method} in serving engines: " + "; ".join(parts)


def verdict_line(report: Report) -> str:
    """The answer in one line: how many loaders keep the scaling, and which do what else.

    ``yarn: every loader keeps it (12 of 12)``, or ``dynamic_ntk: 3 of 12 keep it; approximates: vLLM
    0.12-0.19 ...; fails: ...`` (a loader named once, by the verdict it gets).
    """
    n = len(report.verdicts)
    keep = sum(v.verdict == KEEPS for v in report.verdicts)
    what = report.method + ("" if report.scaled else " (no scaling)")
    if keep == n:
        return f"{what}: every loader keeps it ({n} of {n})"
    groups: dict[str, list[str]] = {}
    for v in report.verdicts:
        if v.verdict != KEEPS:
            groups.setdefault(v.verdict, []).append(f"{v.name} {v.versions}")
    return f"{what}: {keep} of {n} keep it; " + "; ".join(f"{k}: {', '.join(names)}" for k, names in groups.items())


def format_table(report: Report) -> str:
    """The report as text.

    Args:
        report: from :func:`check`.

    Returns:
        A heading line, one aligned line per engine (name, versions, verdict, why) and the note, if any.
    """
    width = max(len(f"{v.name} {v.versions}") for v in report.verdicts)
    lines = [f"{report.source}: {report.method}" + ("" if report.scaled else " (no scaling)")]
    for v in report.verdicts:
        lines.append(f"  {f'{v.name} {v.versions}':<{width}}  {v.verdict:<14}  {v.why}")
    if report.note:
        lines.append(f"note: {report.note}")
    return "\n".join(lines)


__all__ = [
    "ENGINES",
    "Engine",
    "Report",
    "EngineVerdict",
    "check",
    "format_table",
    "verdict_line",
    "outside_note",
    "KEEPS",
    "APPROXIMATES",
    "LOSES",
    "FAILS",
    "CANNOT",
]


def read_config_json(name_or_path: str) -> tuple[ConfigJSON, str]:
    """A checkpoint's config.json (no weights): a directory, a .json file, or a Hub id ``org/name``.

    Args:
        name_or_path: where to read it from; a Hub id downloads config.json alone.

    Returns:
        (the parsed dict, where it was read from). Raises ``RopescaleError`` with one line when it
        cannot be found, read or downloaded (offline, unknown repository...).
    """
    import json
    from pathlib import Path

    from ..errors import RopescaleError, hub_unreachable

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise RopescaleError(f"'{name_or_path}' has no config.json")
    elif not path.is_file():
        if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
            raise RopescaleError(
                f"'{name_or_path}' not found: give a checkpoint directory, a config.json or a Hub id org/name"
            )
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import logging as hub_logging

        level = hub_logging.get_verbosity()
        hub_logging.set_verbosity_error()  # its retry warnings would break the one-line promise
        try:
            path = Path(hf_hub_download(name_or_path, "config.json"))
        except Exception as exc:  # noqa: BLE001 - offline, gated, missing: one line either way
            offline = hub_unreachable(exc, name_or_path)
            if offline is not None:
                raise offline from None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RopescaleError(f"could not download config.json of '{name_or_path}': {first}") from None
        finally:
            hub_logging.set_verbosity(level)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RopescaleError(f"cannot read '{path}': {exc}") from None
    if not isinstance(data, dict):
        raise RopescaleError(f"'{path}' is not a config.json (not a JSON object)")
    return data, str(name_or_path)
