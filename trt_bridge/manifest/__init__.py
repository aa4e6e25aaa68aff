"""``trt-bridge pipeline MANIFEST.yaml``: the engine-build stage of a GPU CI runner.

For each model of the manifest: convert → check → verify (onnxruntime) → bench (onnxruntime), then for
each target: build → verify (engine) → bench (engine). A step the machine cannot do is skipped with the
reason (no TensorRT; no GPU to run an ahead-of-time engine on; ...), and a step whose prerequisite failed
is skipped naming it. The result is written as JUnit XML (for the CI system), a JSON summary and a
markdown summary (for the job's page); the exit status is 1 when a step failed or a gate did not pass.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trt_bridge import __version__
from trt_bridge.bench import BenchOptions, bench
from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.conversion.dynamic_form import convert_as_asked
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.ir.files import external_data_files, inside_folder, same_file, write_text_atomic
from trt_bridge.manifest.report import PipelineReport, Status, StepResult
from trt_bridge.manifest.schema import Manifest, ModelEntry, Target, load_manifest
from trt_bridge.tensorrt import MODULES, gpu_present, import_tensorrt, is_rtx
from trt_bridge.tensorrt.build import build
from trt_bridge.tensorrt.options import BuildOptions
from trt_bridge.tensorrt.profiles import Profile
from trt_bridge.tensorrt.sidecar import sidecar_path
from trt_bridge.verification import VerifyOptions, verify
from trt_bridge.verification.gates import Gate
from trt_bridge.verification.html import render

log = logging.getLogger("trt_bridge.manifest")


@dataclass(frozen=True)
class PipelineOptions:
    models: tuple[str, ...] = ()  # only these models (default: all)
    on_step: object = None  # called with each StepResult as it ends (the CLI prints a progress line)
    output: Path | None = None  # the artifacts' folder (--output): wins over the manifest's
    plugins: tuple[str, ...] = ()  # plugin files every build, engine verify and engine bench registers (--plugins)


def run_pipeline(manifest_path: str | Path, options: PipelineOptions = PipelineOptions()) -> PipelineReport:
    """Run every step the manifest asks for that this machine can do; write the reports; return them."""
    start = time.perf_counter()
    manifest = load_manifest(manifest_path, options.output)
    unknown = sorted(set(options.models) - {m.name for m in manifest.models})
    if unknown:
        raise TrtBridgeError(f"--model {unknown[0]}: the manifest has no such model; it has "
                             f"{', '.join(m.name for m in manifest.models)}.")
    check_artifacts(manifest, options)
    manifest.output.mkdir(parents=True, exist_ok=True)
    report = PipelineReport(str(manifest.path), str(manifest.output), machine=_machine())
    for model in manifest.models:
        if options.models and model.name not in options.models:
            continue
        report.steps += _ModelRun(manifest, model, report.machine, options).run()
    report.seconds = time.perf_counter() - start
    write_text_atomic(manifest.output / "pipeline.json", report.to_json() + "\n")
    write_text_atomic(manifest.output / "pipeline.md", report.markdown())
    write_text_atomic(manifest.output / "pipeline.junit.xml", report.junit_xml())
    return report


def converted_name(model: ModelEntry) -> str:
    """The converted model's file name: NAME.int8.onnx (NAME.fp8.onnx, NAME.int4.onnx where the model's convert table
    asks for that format)."""
    formats = model.convert.formats
    return f"{model.name}.{'int4' if formats.weights else formats.activations or 'int8'}.onnx"


def artifacts(manifest: Manifest, model: ModelEntry) -> list[Path]:
    """Every file the pipeline may write for ``model`` (and the summaries beside its folder)."""
    out, folder, name = manifest.output, manifest.output / model.name, model.name
    paths = [out / "pipeline.json", out / "pipeline.md", out / "pipeline.junit.xml"]
    converted = converted_name(model)
    paths += [folder / f for f in (converted, f"{converted}.data", "convert.json", "check.json",
                                   "verify.json", "reference-outputs.json", "inputs.json", "verify.html", "bench.json")]
    for target in manifest.targets:
        engine = folder / f"{name}.{target.name}.engine"
        paths += [out / f"timing-cache.{target.name}.bin", engine, sidecar_path(engine),
                  folder / f"verify.{engine.stem}.json", folder / f"bench.{engine.stem}.json"]
    return paths


def check_artifacts(manifest: Manifest, options: PipelineOptions = PipelineOptions()) -> None:
    """Before any work: no file the pipeline writes may be one it reads (the manifest, a source or reference model
    and its external data, calibration or evaluation data, a file inside a data folder, a --plugins file)."""
    reads = [manifest.path, *options.plugins]
    for model in manifest.models:
        reads += [model.source, model.reference, model.calib_data, model.eval_data]
        for path in (model.source, model.reference):
            try:
                reads += external_data_files(path)
            except Exception:  # noqa: BLE001 - an unreadable model fails in its own step, with its own message
                pass
    reads = [Path(p) for p in reads if p is not None]
    for model in manifest.models:
        if options.models and model.name not in options.models:
            continue
        folder = manifest.output / model.name
        if folder.is_symlink():
            raise TrtBridgeError(f"{manifest.path}: the output folder of model '{model.name}', {folder}, is a "
                                 f"symbolic link (to {os.readlink(folder)}): the pipeline would write through it. "
                                 "Remove the link, or choose another output folder (--output DIR).")
        for target in artifacts(manifest, model):
            if target.is_symlink():
                raise TrtBridgeError(f"{manifest.path}: the pipeline's artifact {target} is a symbolic link (to "
                                     f"{os.readlink(target)}): the pipeline would write through it. Remove it, or "
                                     "choose another output folder (--output DIR).")
            for source in reads:
                if same_file(target, source) or inside_folder(target, source):
                    raise TrtBridgeError(f"{manifest.path}: the pipeline would write {target} over {source}, which it "
                                         "reads; choose another output folder (the manifest's output, or "
                                         "--output DIR) or move the file.")


def check_summary_path(manifest: Manifest, path: str | Path | None, options: PipelineOptions = PipelineOptions()
                       ) -> None:
    """Before any work: ``pipeline --json FILE`` must be none of the pipeline's artifacts and lie in none of its
    models' folders (it would replace a converted model, an engine or ``pipeline.md`` with the summary)."""
    if path is None or str(path) == "-":
        return
    for model in manifest.models:
        if options.models and model.name not in options.models:
            continue
        folder = manifest.output / model.name
        for artifact in artifacts(manifest, model):
            if same_file(path, artifact):
                raise TrtBridgeError(f"--json {path} is {artifact}, which the pipeline writes itself; write the "
                                     "summary elsewhere (it is also in pipeline.json).")
        if same_file(path, folder) or inside_folder(path, folder) or Path(path).absolute().parent == folder.absolute():
            raise TrtBridgeError(f"--json {path} lies in {folder}, the folder the pipeline writes model "
                                 f"'{model.name}''s artifacts into; write the summary elsewhere.")


def _machine() -> dict:
    """What this machine can do: TensorRT (which), a GPU, onnxruntime's providers."""
    import onnxruntime

    info = {"trt_bridge": __version__, "python": platform.python_version(), "platform": platform.platform(),
            "onnxruntime": onnxruntime.__version__, "providers": onnxruntime.get_available_providers(),
            "gpu": gpu_present(), "tensorrt": None, "tensorrt_rtx": None}
    for name in MODULES:  # both may be installed: RTX builds ahead of time, tensorrt locally
        try:
            trt = import_tensorrt(name)
        except MissingDependencyError:
            continue
        info[name] = {"module": trt.__name__, "version": getattr(trt, "__version__", "?"), "rtx": is_rtx(trt)}
    if info["tensorrt"] is None and info["tensorrt_rtx"] is not None:
        info["tensorrt"] = info["tensorrt_rtx"]
    return info


class _ModelRun:
    """The steps of one model, in order; each records its result and whether later steps can use it."""

    def __init__(self, manifest: Manifest, model: ModelEntry, machine: dict, options: PipelineOptions):
        self.manifest, self.model, self.machine, self.options = manifest, model, machine, options
        self.folder = manifest.output / model.name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.converted = self.folder / converted_name(model)
        self.results: list[StepResult] = []

    def run(self) -> list[StepResult]:
        convert = self._step("convert", None, self._convert)
        if convert.status is not Status.PASSED:
            for step in ("check", "verify", "bench"):
                self._skip(step, None, "convert did not pass")
            for target in self.manifest.targets:
                for step in ("build", "verify-engine", "bench-engine"):
                    self._skip(step, target.name, "convert did not pass")
            return self.results
        self._step("check", None, self._check)
        self._step("verify", None, self._verify)
        self._step("bench", None, self._bench)
        for target in self.manifest.targets:
            self._target(target)
        return self.results

    # -- bookkeeping -----------------------------------------------------------------------------

    def _step(self, step: str, target: str | None, action) -> StepResult:
        log.info("%s: %s%s", self.model.name, step, f" [{target}]" if target else "")
        start = time.perf_counter()
        try:
            status, message, details, artifacts = action()
        except TrtBridgeError as exc:
            status, message, details, artifacts = Status.ERROR, str(exc).splitlines()[0], {"error": str(exc)}, []
        except Exception as exc:  # noqa: BLE001 - one model's failure must not stop the others; recorded in full
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            log.error("%s: %s failed unexpectedly (a bug in trt-bridge; -vv shows the traceback): %s: %s",
                      self.model.name, step, type(exc).__name__, first)
            log.debug("traceback", exc_info=True)
            status, message = Status.ERROR, f"{type(exc).__name__}: {first}"
            details, artifacts = {"error": repr(exc)}, []
        result = StepResult(self.model.name, target, step, status, time.perf_counter() - start, message, details,
                            [str(a) for a in artifacts])
        self._record(result)
        return result

    def _record(self, result: StepResult) -> None:
        self.results.append(result)
        if self.options.on_step is not None:
            self.options.on_step(result)

    def _skip(self, step: str, target: str | None, why: str) -> StepResult:
        result = StepResult(self.model.name, target, step, Status.SKIPPED, 0.0, why)
        self._record(result)
        return result

    # -- model steps -----------------------------------------------------------------------------

    def _convert(self):
        report = convert_as_asked(self.model.source, self.converted, replace(self.model.convert, progress=False,
                                                                               check=False))
        report_path = self.folder / "convert.json"
        write_text_atomic(report_path, report.to_json() + "\n")
        quantized = len(report.quantized)
        return (Status.PASSED, f"{quantized} tensor(s) quantized in {sum(report.seconds.values()):.1f} s",
                {"rules": [asdict(r) for r in report.rules], "quantized": quantized,
                 "left_in_float": len(report.left_in_float)}, [self.converted, report_path])

    def _check(self):
        report = check_model(self.converted, CheckOptions(plugins=self.options.plugins))
        path = self.folder / "check.json"
        write_text_atomic(path, report.to_json() + "\n")
        status = Status.PASSED if report.ready else Status.FAILED
        return status, report.headline().split(": ", 1)[-1], {"ready": report.ready,
                                                            "findings": len(report.findings)}, [path]

    def _eval_options(self, **extra):
        gates = []
        metric = {"min_snr": "snr_db", "min_cosine": "cosine", "max_abs": "max_abs"}
        for key, value in self.model.gates.items():
            if isinstance(value, dict):
                gates += [Gate(metric[key], float(v), output) for output, v in value.items()]
            else:
                gates.append(Gate(metric[key], float(value)))
        data = str(self.model.eval_data) if self.model.eval_data else None
        random = None if data else (self.model.eval_random or 8)
        return VerifyOptions(data=data, random=random, gates=tuple(gates), progress=False, plugins=self.options.plugins,
                             shapes=dict(self.model.shapes) or None, **extra)

    def _verify(self):
        report = verify(self.model.reference, self.converted, self._eval_options(
            save_outputs=str(self.folder / "reference-outputs.json"),
            save_inputs=str(self.folder / "inputs.json")))
        path, text = self.folder / "verify.json", report.to_json()
        write_text_atomic(path, text + "\n")
        artifacts = [path, self.folder / "reference-outputs.json", self.folder / "inputs.json"]
        try:
            write_text_atomic(self.folder / "verify.html", render(report))
            artifacts.append(self.folder / "verify.html")
        except TrtBridgeError as exc:  # matplotlib missing: the HTML page is optional
            log.info("no HTML report: %s", exc)
        return _verdict(report), _metrics_line(report), json.loads(text), artifacts

    def _bench(self):
        report = bench([self.model.reference, self.converted], BenchOptions(**self._bench_options()))
        return self._bench_result(report, "bench")

    def _bench_options(self) -> dict:
        options = {**self.model.bench, "plugins": self.options.plugins}
        if self.model.shapes:
            options["shapes"] = dict(self.model.shapes)
        return options

    def _bench_result(self, report, name: str):
        path, text = self.folder / f"{name}.json", report.to_json()
        write_text_atomic(path, text + "\n")
        rows = json.loads(text)["rows"]
        line = "; ".join(f"{Path(r['path']).name} median {r['stats']['median']:.3f} ms" for r in rows)
        return Status.PASSED, line, {"rows": rows}, [path]

    # -- target steps ----------------------------------------------------------------------------

    def _target(self, target: Target) -> None:
        why = self._cannot_build(target)
        engine = self.folder / f"{self.model.name}.{target.name}.engine"
        if why:
            self._skip("build", target.name, why)
            build_ok = False
        else:
            build_ok = self._step("build", target.name, lambda: self._build(target, engine)).status is Status.PASSED
        run_why = self._cannot_run(target, build_ok)
        for step, action in (("verify-engine", lambda: self._verify_engine(engine)),
                             ("bench-engine", lambda: self._bench_engine(engine))):
            if run_why:
                self._skip(step, target.name, run_why)
            else:
                self._step(step, target.name, action)

    def _cannot_build(self, target: Target) -> str | None:
        trt = self.machine.get("tensorrt")
        if trt is None:
            return "no TensorRT here (pip install 'trt-bridge[rtx]' to build ahead of time, or '[trt]' on a GPU)"
        if target.compute_capabilities and self.machine.get("tensorrt_rtx") is None:
            return (f"ahead-of-time builds for compute capability {', '.join(target.compute_capabilities)} need "
                    f"TensorRT-RTX; this machine has {trt['module']} {trt['version']}")
        if target.gpu and not self.machine.get("gpu"):
            return "the target is this machine's GPU, and this machine has none"
        return None

    def _cannot_run(self, target: Target, built: bool) -> str | None:
        if not built:
            return "no engine: build did not pass"
        if not target.gpu:
            return (f"an ahead-of-time engine for compute capability {', '.join(target.compute_capabilities)} runs "
                    "on such a GPU only; add a `gpu: true` target on a GPU runner to run it")
        if not self.machine.get("gpu"):
            return "running an engine needs an NVIDIA GPU"
        return None

    def _build(self, target: Target, engine: Path):
        profiles = (Profile.fixed(self.model.shapes),) if self.model.shapes else ()
        cache = self.manifest.output / f"timing-cache.{target.name}.bin"
        result = build(self.converted, engine, BuildOptions(
            profiles=profiles, compute_capabilities=target.compute_capabilities, timing_cache=str(cache),
            progress=False, plugins=self.options.plugins))
        size = result.info["engine"]["size"]
        return (Status.PASSED, f"{size / 2**20:.1f} MiB engine in {result.seconds:.1f} s", result.info,
                [result.engine, result.sidecar])

    def _verify_engine(self, engine: Path):
        report = verify(self.model.reference, self.converted, self._eval_options(engine=str(engine)))
        path, text = self.folder / f"verify.{engine.stem}.json", report.to_json()
        write_text_atomic(path, text + "\n")
        return _verdict(report), _metrics_line(report), json.loads(text), [path]

    def _bench_engine(self, engine: Path):
        report = bench([self.converted, engine], BenchOptions(**self._bench_options()))
        return self._bench_result(report, f"bench.{engine.stem}")


def _verdict(report) -> Status:
    return Status.PASSED if report.passed else Status.FAILED


def _metrics_line(report) -> str:
    parts = []
    for m in report.outputs:
        verdict = "" if m.passed else " FAIL: " + "; ".join(m.failures)
        parts.append(f"{m.runner} '{m.output}' SNR {m.snr_text()} dB, cosine {m.cosine:.4f}{verdict}")
    return "; ".join(parts)


__all__ = ["PipelineOptions", "run_pipeline"]
