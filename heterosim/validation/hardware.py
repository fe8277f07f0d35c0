"""Hardware words of a validation case -> a catalogue GPU and a cluster spec.

:func:`gpu_from_text` maps "NVIDIA H100 80GB HBM3 (SXM5)" to a GPU of the ``kernel_db`` catalogue;
:func:`cluster_for` builds a cluster spec for :func:`heterosim.cluster.load_cluster` from the
``hardware`` section: a preset whose system name the text names, with the case's GPU and NICs, or a
node built from the words (NVLink generation / NVSwitch / lanes, "8 x 400 Gb/s NDR").
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from heterosim.cluster.spec import DEFAULT_DISPATCH_US, GRACE_DISPATCH_FACTOR
from heterosim.errors import ConfigError, UnknownGPUError

from .phrases import count as read_count

__all__ = ["gpu_from_text", "board_variant", "cluster_for"]

# NVLink per-lane rate per direction, GB/s, by generation (NVLink 2.0-4.0: 25 GB/s, 5.0: 50 GB/s;
# NVIDIA V100/A100/H100/B200 whitepapers).
_NVLINK_LANE_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# InfiniBand generations -> per-port line rate, Gb/s (4x links; IBTA roadmap).
_IB_GBPS = {"edr": 100.0, "hdr": 200.0, "ndr": 400.0, "xdr": 800.0}


# ---------------------------------------------------------------------------------------- GPUs
def _model_word(name: str) -> str:
    """The word of a catalogue name that names the model: its first part with a digit ("A100" of
    "A100-SXM4-80GB", "3090" of "RTX-3090"), else its first part ("TITAN" of "TITAN-RTX")."""
    parts = name.split("-")
    return next((p for p in parts if any(ch.isdigit() for ch in p)), parts[0])


def gpu_from_text(text: str) -> str:
    """The catalogue name of the GPU free text describes, e.g. "NVIDIA A100 (SXM4; 40GB ...)".

    An exact name or alias wins; otherwise catalogue GPUs whose model number ("A100", "H20") is a
    word of the text, narrowed by form factor (SXM / PCIe) and memory size ("80GB") when stated.

    Raises:
        UnknownGPUError: no catalogue GPU, or several, fit the words (the message lists them).
    """
    from heterosim.cluster.gpus import load_catalogue

    cat = load_catalogue()
    for t in (text, re.sub(r"\(.*?\)", "", text).strip()):  # as written, then without remarks
        try:
            return cat.get(t).name
        except UnknownGPUError:
            pass
    cands = [g for g in cat.gpus if re.search(
        r"(?<![A-Za-z0-9])" + re.escape(_model_word(g.name)) + r"(?![0-9])", text, re.I)]
    low = re.sub(r"\bnot\s+\w+", " ", text.lower())  # "NOT SXM" names no form factor
    for word in ("sxm", "pcie"):
        if word in low:
            cands = [g for g in cands if word in g.name.lower()] or cands
    sizes = {float(m) for m in re.findall(r"(\d+)\s*GB(?!/)", text, re.I)}
    if sizes:
        cands = [g for g in cands if round(g.hbm_bytes / 2**30) in sizes] or cands
    if len(cands) > 1:  # the form factor a bare model number means ("H100" is the SXM part, as its alias says)
        bare = [g for g in cands if any(a.lower() == _model_word(g.name).lower() for a in g.aliases)]
        cands = bare if len(bare) == 1 else cands
    if len(cands) == 1:
        return cands[0].name
    names = ", ".join(g.name for g in cands) if cands else ", ".join(cat.names())
    raise UnknownGPUError(f"GPU {text!r}: {'several catalogue GPUs fit' if cands else 'no catalogue GPU fits'} "
                          f"({names}); name the model, form factor and memory, e.g. 'A100-SXM4-80GB'")


_POWER_KEYS = ("power_limit_W", "power_cap_W", "power_W", "tdp_W")
_HBM_KEYS = ("hbm_bandwidth_TBps", "hbm_bw_TBps", "memory_bandwidth_TBps")


def _stated_number(hardware: Mapping[str, Any], keys: tuple[str, ...], pattern: str, text: str,
                   what: str) -> float | None:
    """The first of ``keys`` the section gives, else the first match of ``pattern`` in ``text``."""
    for k in keys:
        if hardware.get(k) not in (None, ""):
            m = re.search(r"\d+(?:\.\d+)?", str(hardware[k]))
            if not m:
                raise ConfigError(f"hardware.{k} {hardware[k]!r}: give {what} as a number")
            return float(m.group(0))
    m = re.search(pattern, text, re.I)
    return float(m.group(1).replace(",", "")) if m else None


def board_variant(hardware: Mapping[str, Any], spec: Any) -> tuple[Any, list[str]]:
    """The board ``hardware`` describes, as ``spec`` or a variant of it, and what changed.

    A power limit other than the catalogue's (``hardware.power_limit_W``, or "500 W power limit" /
    "(SXM5, 700 W TDP)" in the GPU text) runs tensor work at that limit's sustained clock
    (:meth:`GpuSpec.at_power_limit`); a memory size the catalogue board does not have ("96GB
    HBM2e") takes that size and the stated bandwidth (``hardware.hbm_bandwidth_TBps`` or "2.4 TB/s"
    in the GPU text), else the catalogue board's, said so. A board the catalogue has as stated
    keeps its datasheet figures.
    """
    from dataclasses import replace

    text = str(hardware.get("gpu", ""))
    notes: list[str] = []
    out = spec
    sizes = [int(m) for m in re.findall(r"(\d+)\s*GB(?!/)", text, re.I)]
    size = next((g for g in sizes if g != round(spec.hbm_bytes / 2**30)), None)
    if size is not None and round(spec.hbm_bytes / 2**30) not in sizes:
        bw = _stated_number(hardware, _HBM_KEYS, r"(\d+(?:\.\d+)?)\s*TB/s", text, "the memory bandwidth in TB/s")
        out = replace(out, name=f"{spec.name.rsplit('-', 1)[0] if spec.name.endswith('GB') else spec.name}-{size}GB",
                      aliases=(), hbm_bytes=size * 2**30, hbm_bw=bw * 1e12 if bw else spec.hbm_bw)
        notes.append(f"{size} GB of memory (the catalogue's {spec.name} has {spec.hbm_bytes / 2**30:g}): "
                     + (f"{bw:g} TB/s as stated" if bw else
                        f"its bandwidth not stated, {spec.hbm_bw / 1e12:g} TB/s of the {spec.name} taken"))
    watts = _stated_number(hardware, _POWER_KEYS, r"(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*W(?![a-z])", text,
                           "the power limit in W")
    if watts is not None and watts != spec.tdp_w:
        out = out.at_power_limit(watts)
        notes.append(f"power limit {watts:g} W (the {spec.name}'s is {spec.tdp_w:g} W): tensor work at "
                     f"{out.sustained_clock_ratio:.3f} of boost (cube law through {spec.power_clock_ratio:.3f} "
                     f"at {spec.tdp_w:g} W; docs/kernel_db.md)")
    return out, notes


# ------------------------------------------------------------------------------------ clusters
_RATE = r"(\d+(?:\.\d+)?)\s*([tg])(?:bit/s|b/s|bps|bits?|be|b(?![a-z])|(?![a-z]))"
"""A line rate: "400 Gb/s", "400Gbps", "400G", "400GbE", "3.2 Tbps" (groups: number, T or G)."""


def _gbps(m: re.Match, i: int = 1) -> float:
    return float(m.group(i)) * (1000.0 if m.group(i + 1).lower() == "t" else 1.0)


def _nics(text: str) -> tuple[int | None, float | None]:
    """(count, Gb/s per NIC) stated by inter-node text; None where it is not stated.

    "8 x 400 Gb/s", "8x ConnectX-7 400G", "8*400Gbps", "400G NDR x 8", "IB 200Gb x4", "8 NICs ...
    400 Gb/s", a rate alone, or the IB generation ("NDR", "NDR400", "HDR100"). A rate given per node
    ("3.2 Tbps per node") has no count here: :func:`_node_total_Gbps` reads it.
    """
    t = text.replace("×", "x").replace("*", "x")
    for pat, ci, ri in ((r"(\d+)\s*x\s*" + _RATE, 1, 2),
                        (r"(\d+)\s*x\s*(?:[a-z][\w.-]*\s+){1,3}" + _RATE, 1, 2),
                        (_RATE + r"[^\d,;(]{0,24}?\bx\s*(\d+)", 3, 1),
                        (r"(\d+)\s+(?:nics?|hcas?|ports?|adapters?|rails?|connectx[\w-]*|cx-?\d)\b.*?" + _RATE, 1, 2)):
        m = re.search(pat, t, re.I)
        if m:
            return int(m.group(ci)), _gbps(m, ri)
    if _node_total_Gbps(text) is not None:
        return None, None
    m = re.search(_RATE, t, re.I)
    if m:
        return None, _gbps(m)
    m = re.search(r"\b(edr|hdr|ndr|xdr)(\d{3})?\b", t, re.I)
    if m:
        return None, float(m.group(2)) if m.group(2) else _IB_GBPS[m.group(1).lower()]
    return None, None


def _node_total_Gbps(text: str) -> float | None:
    """Gb/s a node has in all, where the text gives one rate per node and no NIC count ("EFA,
    3,200 Gbps per node", "3.2 Tbps aggregate"); None otherwise."""
    t = text.replace(",", "")
    m = re.search(_RATE + r"\s*(?:of\s+)?(?:per\s+(?:node|server|instance)|aggregate|total)\b", t, re.I) \
        or re.search(r"\b(?:aggregate|total)\b[^;\d]{0,20}" + _RATE, t, re.I)
    return _gbps(m) if m else None


def _routing(text: str) -> str | None:
    """The fabric routing the inter-node text implies: ``adaptive`` for InfiniBand (its subnet
    manager enables adaptive routing by default and NCCL uses it on IB links) and for Spectrum-X
    Ethernet (built on RoCE adaptive routing, NVIDIA Spectrum-X reference architecture), ``ecmp``
    for other RoCE / Ethernet; None when the text names neither."""
    if re.search(r"spectrum[\s-]*x", text, re.I):
        return "adaptive"
    if re.search(r"\b(roce(?:v2)?|ethernet|\d*gbe|tcp|tcpx)\b", text, re.I):
        return "ecmp"
    if re.search(r"\b(infiniband|ib|edr|hdr|ndr|xdr)(\d{3})?\b", text, re.I):
        return "adaptive"
    return None


def _nic_summary(nics: Any) -> tuple[int, float]:
    """(count, Gb/s) of a spec's ``nics`` entry, shorthand or list."""
    if isinstance(nics, Mapping):
        return int(nics["count"]), float(nics["bw_Gbps"])
    return len(nics), max(float(n["bw_Gbps"]) for n in nics)


def _nvlink(text: str, gpu_nvlink_GBps: float, board: bool = False) -> dict[str, Any] | None:
    """The ``nvlink:`` section intra-node text describes (``nvls`` as the text states it, ``implied``
    when the switch is the board's, not the text's); None for PCIe-only nodes. ``board``: the node
    is 8 SM80+ SXM GPUs, which sit on an NVSwitch baseboard whether or not the text says so."""
    low = text.lower()
    if "nvlink" not in low and "nvswitch" not in low:
        if "pcie" in low:
            return None
        raise ConfigError(f"intra_node {text!r}: say NVLink/NVSwitch or PCIe")
    gen = re.search(r"nvlink\s*(\d)", low)
    lane = _NVLINK_LANE_GBPS[int(gen.group(1))] if gen else 25.0
    lanes = re.search(r"(\d+)\s*(?:nvlink\s*)?(?:links|lanes)", low)
    bidir = re.search(r"(\d+(?:\.\d+)?)\s*gb/s\s*bidirectional", low)
    if lanes:
        n = int(lanes.group(1))
    elif bidir:
        n = round(float(bidir.group(1)) / 2 / lane)
    else:  # the GPU's datasheet NVLink bandwidth per direction
        n = round(gpu_nvlink_GBps / lane)
    implied = "nvswitch" not in low and _nvlink_domain(text) is None
    if implied and not (board and "bridge" not in low):
        raise ConfigError(f"intra_node {text!r}: NVLink without NVSwitch needs a mesh; write a cluster "
                          "YAML (docs/clusters.md) for it")
    return {"kind": "nvswitch", "lanes": n, "lane_GBps": lane, "nvls": _nvls_words(low), "implied": implied}


def _nvls_words(low: str) -> bool | None:
    """NVLink SHARP as lower-case intra-node text states it: False where it is switched off ("NVLS
    off", "without SHARP", "NCCL_NVLS_ENABLE=0"), True where it is named, None where not stated."""
    if re.search(r"\b(?:no|without|disabled?|off)\W+(?:nvlink\s+)?(?:nvls|sharp)\b|\b(?:nvls|sharp)\W+(?:off|disabled)\b"
                 r"|nccl_nvls_enable\s*=\s*0", low):
        return False
    return True if re.search(r"\b(?:nvls|sharp)\b", low) else None


def _nvlink_domain(text: str) -> int | None:
    """GPUs of a rack-scale NVLink domain the text names ("GB200 NVL72", "72-GPU NVLink domain"),
    else None."""
    m = re.search(r"\bnvl\s*(\d+)", text, re.I) or re.search(r"(\d+)[-\s]*gpus?\s+nvlink\s+domain", text, re.I)
    return int(m.group(1)) if m else None


def _domain_gpus(domain: int, tray: int, num_gpus: int) -> int:
    """GPUs of the NVLink domain one job's share of a rack spans: the largest multiple of the tray's
    GPUs that divides the job and fits the domain (a 128-GPU job on NVL72 racks: two domains of 64)."""
    fits = [g for g in range(tray, min(domain, num_gpus) + 1, tray) if num_gpus % g == 0]
    return max(fits) if fits else min(domain, num_gpus)


def _preset_node(system: str, gpn: int) -> tuple[str, dict[str, Any]] | None:
    """(name, spec dict) of the preset whose name's words stand alone in the ``system`` text, any
    separators ("DGX A100 (Selene)", "DGX-A100"; "HGX H200" is not preset hgx-h20), with ``gpn``
    GPUs per node; None when none fits."""
    from heterosim.cluster import preset_names, preset_path, read_spec

    low = system.lower()
    for name in sorted(preset_names(), key=len, reverse=True):
        words = r"[^0-9a-z]*".join(re.escape(w) for w in re.split(r"[^0-9a-z]+", name.lower()) if w)
        if low and re.search(r"(?<![0-9a-z])" + words + r"(?![0-9a-z])", low):
            cand = read_spec(preset_path(name)).to_dict()
            if next(iter(cand["node_types"].values()))["gpus_per_node"] == gpn:
                return name, cand
    return None


GB_NVLINK_DOMAIN = 72
"""GPUs of one NVLink domain of Grace-Blackwell systems: GB200 / GB300 NVL72, 18 compute trays of 4
GPUs joined by 9 NVLink switch trays (NVIDIA GB200 NVL72 and GB300 NVL72 datasheets)."""


def _grace_blackwell(spec: Any) -> bool:
    return spec.vendor == "nvidia" and spec.name.upper().startswith("GB") and spec.nvlink_bw > 0


def _grace_host(node: dict[str, Any], notes: list[str]) -> None:
    """A Grace-Blackwell tray's host is two Grace CPUs, slower to issue ops than x86 servers."""
    node["cpu"]["dispatch_us"] = {k: round(v * GRACE_DISPATCH_FACTOR, 2) for k, v in DEFAULT_DISPATCH_US.items()}
    notes.append(f"host CPU: Grace, {GRACE_DISPATCH_FACTOR}x an x86 server's time to issue an op "
                 "(TransformerEngine#2053: nn.Linear forward 37.08 us on GB200, 13.48 us on DGX H100)")


def _nvlink_gen(spec: Any) -> int:
    return 5 if spec.compute_capability >= 100 else 4 if spec.compute_capability >= 90 else 3


def default_nic(spec: Any) -> tuple[float, str]:
    """(Gb/s, which) of the one NIC per GPU a system of ``spec`` carries where the case names none:
    ConnectX-8 800 Gb/s from Blackwell Ultra (DGX B300, GB300 NVL72: sm_103), ConnectX-7 400 Gb/s NDR
    on Hopper and Blackwell (DGX H100 / H200 / B200, GB200 NVL72), else 200 Gb/s (DGX A100's HDR, the
    default for earlier GPUs too). NVIDIA's DGX / NVL72 datasheets."""
    cc = spec.compute_capability
    if cc >= 103:
        return 800.0, "ConnectX-8 (DGX B300, GB300 NVL72)"
    if cc >= 90:
        return 400.0, "ConnectX-7 NDR (DGX H100 / H200 / B200, GB200 NVL72)"
    return 200.0, "HDR (DGX A100; the default before Hopper)"


def _switch_board(spec: Any, gpus_per_node: Any) -> bool:
    """Whether a node of ``gpus_per_node`` of ``spec`` sits on an NVSwitch baseboard: HGX / DGX A100
    and later join 8 SXM GPUs through NVSwitch chips (an 8-GPU mesh exists only before them: DGX-1's
    hybrid cube-mesh of V100s), so "NVLink" alone, or nothing, on such a node means them."""
    return (spec.vendor == "nvidia" and spec.compute_capability >= 80 and spec.nvlink_bw > 0
            and "pcie" not in spec.name.lower() and gpus_per_node == 8)


def _set_nvlink(node: dict[str, Any], intra: str, spec: Any, notes: list[str]) -> None:
    """The node's ``nvlink:`` section from the intra-node text (removed for a PCIe-only node)."""
    nv = _nvlink(intra, spec.nvlink_bw / 1e9, _switch_board(spec, node.get("gpus_per_node")))
    if nv is None:
        node.pop("nvlink", None)
        return
    nvls = nv.pop("nvls")
    if nv.pop("implied"):
        notes.append("intra_node names NVLink without NVSwitch: 8 SM80+ SXM GPUs per node sit on an NVSwitch "
                     "baseboard (HGX / DGX A100 and later), taken as one")
    node["nvlink"] = {**node.get("nvlink", {}), **nv}
    if nvls is None:
        # NCCL turns NVLS on by default (NCCL_NVLS_ENABLE=2: "on where supported") where the
        # NVSwitch has NVLink SHARP (third generation on, with SM90+ GPUs: HGX H100 / H200 / B200
        # boards); a recipe that switches it off says so in its NCCL environment.
        nvls = spec.vendor == "nvidia" and spec.compute_capability >= 90
        if nvls:
            notes.append("NVLink SHARP not stated: on (NCCL's default on NVSwitch with SM90+ GPUs, NCCL_NVLS_ENABLE=2)")
    node["nvlink"]["nvls"] = nvls


def _part_of_node(node: dict[str, Any], gpn: int, num_gpus: int, notes: list[str]) -> None:
    """A job on part of one node: the node modelled with just the GPUs it uses (and their NICs)."""
    node["gpus_per_node"] = num_gpus
    if isinstance(node.get("pcie"), Mapping):
        node["pcie"] = {k: v for k, v in node["pcie"].items() if k != "switches"}
    n, bw = _nic_summary(node["nics"])
    node["nics"] = {"count": max(1, n * num_gpus // gpn), "bw_Gbps": bw}
    notes.append(f"job uses {num_gpus} of the node's {gpn} GPUs: node modelled with those GPUs only")


def cluster_for(hardware: Mapping[str, Any], num_gpus: int) -> tuple[dict[str, Any], str, list[str]]:
    """(cluster spec dict, catalogue GPU, assumptions) for a case's ``hardware`` section.

    If the ``system`` text names a preset's system ("DGX A100 (Selene)" -> ``dgx-a100``) and the
    GPUs per node agree, that preset's node (PCIe switches, CPUs, fabric) is used with the case's
    GPU, NVLink and NICs; otherwise a node is built from the words alone (PCIe switches one per
    GPU pair, two sockets, rail-optimized fabric with 32 nodes per leaf).
    """
    from heterosim.cluster import get_gpu

    notes: list[str] = []
    if "gpu" not in hardware:
        raise ConfigError("hardware: no 'gpu' given; name the GPU, e.g. 'NVIDIA A100-SXM4-80GB'")
    from heterosim.cluster.gpus import entry_of

    gpu = gpu_from_text(str(hardware["gpu"]))
    spec = get_gpu(gpu)
    board, board_notes = board_variant(hardware, spec)
    notes += board_notes
    tray = 4 if _grace_blackwell(spec) else 8  # a GB200 / GB300 compute tray holds 4 GPUs
    gpn = read_count(hardware.get("gpus_per_node") or min(num_gpus, tray), "hardware.gpus_per_node")[0]  # "8 (HGX)"
    if "gpus_per_node" not in hardware:
        notes.append(f"gpus_per_node not stated: {gpn}")
    base = _preset_node(str(hardware.get("system", "")), gpn)
    intra = str(hardware.get("intra_node", ""))
    inter = str(hardware.get("inter_node", ""))
    count, rate = _nics(inter) if inter and not inter.lower().startswith("n/a") else (None, None)
    if base is not None:
        name, d = base
        tname = next(iter(d["node_types"]))
        node = d["node_types"][tname]
        notes.append(f"node layout (PCIe switches, CPUs, fabric) of preset {name}")
    else:
        d = {"schema_version": 1, "node_types": {}, "fabric": {"kind": "rail_optimized", "nodes_per_leaf": 32}}
        tname = "node"
        gen = {16: 3, 32: 4, 64: 5, 128: 6}.get(round(spec.pcie_bw / 1e9), 4)
        node = {"gpus_per_node": gpn, "pcie": {"gen": gen}, "cpu": {"sockets": 2, "vendor": "other"}}
        notes.append(f"node built from the text: PCIe Gen{gen} (the GPU's), a switch per GPU pair, 2 sockets, "
                     "rail-optimized fabric, 32 nodes per leaf")
        if _grace_blackwell(spec):
            _grace_host(node, notes)
    domain = _nvlink_domain(f"{intra} {hardware.get('system', '')}")
    if domain is None and base is None and not intra and _grace_blackwell(spec):
        domain = GB_NVLINK_DOMAIN
        notes.append(f"NVLink domain not stated: {domain} GPUs ({spec.name} trays sit in NVL{domain} racks)")
    if intra:
        _set_nvlink(node, intra, spec, notes)
    elif base is None and domain is not None:
        notes.append("intra_node not stated: the rack's NVSwitch fabric at the GPU's datasheet NVLink rate")
        _set_nvlink(node, f"NVLink{_nvlink_gen(spec)} NVSwitch", spec, notes)
    elif base is None and _switch_board(spec, gpn):
        notes.append("intra_node not stated: an NVSwitch baseboard at the GPU's datasheet NVLink rate "
                     "(8 SM80+ SXM GPUs per node: HGX / DGX A100 and later)")
        _set_nvlink(node, f"NVLink{_nvlink_gen(spec)} NVSwitch", spec, notes)
    if domain is not None and domain > gpn and base is None:
        # One NVSwitch fabric joins the trays of a rack (NVIDIA GB200 NVL72: 18 trays of 4 GPUs, 72
        # GPUs at full NVLink bandwidth): the model's "node" is the domain, each tray's NICs kept.
        span = _domain_gpus(domain, gpn, num_gpus)
        if count is not None:
            count = count * span // gpn
        notes.append(f"NVLink domain of {domain} GPUs: modelled as NVSwitch nodes of {span} GPUs "
                     f"({span // gpn} trays of {gpn}) with their trays' NICs")
        gpn = node["gpus_per_node"] = span
    total = _node_total_Gbps(inter) if inter and rate is None else None
    if count is None and (rate is not None or total is not None):
        count = _nic_summary(node["nics"])[0] if node.get("nics") else gpn
        if total is not None:  # a rate per node ("3,200 Gbps per node"): shared by the node's NICs
            rate = total / count
            notes.append(f"{total:g} Gb/s per node: {count} NICs of {rate:g} Gb/s (the count not stated)")
        else:
            notes.append(f"NICs per node not stated: {count}")
    if rate is not None:
        node["nics"] = {"count": count, "bw_Gbps": rate}
        if base is not None and isinstance(node.get("pcie"), Mapping) and "switches" in node["pcie"]:
            sw = node["pcie"]["switches"]
            per = count // len(sw) if count % len(sw) == 0 else None
            if per is None:
                node["pcie"] = {k: v for k, v in node["pcie"].items() if k != "switches"}
            else:
                node["pcie"]["switches"] = [{**s, "nics": list(range(i * per, (i + 1) * per))} for i, s in enumerate(sw)]
    elif "nics" not in node:
        rate, which = default_nic(spec)
        node["nics"] = {"count": gpn, "bw_Gbps": rate}
        notes.append(f"no inter-node network stated: one {rate:g} Gb/s NIC per GPU, {which} (unused on one node)")
    if num_gpus < gpn:
        _part_of_node(node, gpn, num_gpus, notes)
    routing = _routing(inter)
    if routing and isinstance(d.get("fabric"), dict) and d["fabric"].get("kind") in ("rail_optimized", "leaf_spine"):
        if d["fabric"].get("routing", "ecmp") != routing:
            notes.append(f"fabric routing {routing} ({'InfiniBand' if routing == 'adaptive' else 'Ethernet'} "
                         "in the inter-node text)")
        d["fabric"] = {**d["fabric"], "routing": routing}
    d["node_types"] = {tname: node}
    d["name"] = "case"
    d["description"] = f"{hardware.get('gpu')}; {intra}; {inter}"
    d["node_groups"] = [{"name": "g", "gpu": board.name, "node_type": tname}]
    if board is not spec:
        d["gpus"] = [entry_of(board)]
    d.pop("placement", None)
    return d, gpu, notes
