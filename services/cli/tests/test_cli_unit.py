import argparse

import pytest
from whetstone.cli.api_objects import Job, JobEvent
from whetstone.cli.errors import BadInput
from whetstone.cli.follow import LossCurve, StepRate, eta_text
from whetstone.cli.job_request import request_json
from whetstone.cli.public import job_body as build_body

pytestmark = pytest.mark.unit


def args(**kw) -> argparse.Namespace:
    base = {"model": "tiny-llama", "training_file": "ds-1", "method": "supervised", "epochs": None,
            "learning_rate": None, "batch_size": None, "hp": None, "validation_file": None, "suffix": None, "seed": None}
    return argparse.Namespace(**{**base, **kw})


def job_body(namespace: argparse.Namespace) -> dict:
    """The create body as it goes on the wire."""
    return request_json(build_body(namespace))


def test_job_body_is_openai_shaped_with_the_platform_method_as_extension():
    assert job_body(args()) == {"model": "tiny-llama", "training_file": "ds-1", "method": {"type": "supervised"}}
    body = job_body(args(method="qlora", epochs=2, hp=["lora_r=8", "note=x"], seed=3))
    assert body["method"] == {"type": "supervised", "whetstone": {"method": "qlora"},
                              "supervised": {"hyperparameters": {"n_epochs": 2, "lora_r": 8, "note": "x"}}}
    assert body["seed"] == 3
    assert job_body(args(method="orpo"))["method"] == {"type": "dpo", "whetstone": {"method": "orpo"}}
    with pytest.raises(SystemExit):
        job_body(args(method="rlhf"))
    with pytest.raises(SystemExit):
        job_body(args(hp=["no-equals"]))
    with pytest.raises(BadInput, match="^suffix: "):   # the API's bound, checked before sending
        job_body(args(suffix="x" * 65))


def test_loss_curve_png(tmp_path):
    curve = LossCurve()
    for step, loss in enumerate([2.0, 1.5, 1.2, 1.1], start=1):
        curve.add(step, loss)
    curve.add_events([JobEvent.from_api(e) for e in
                      ({"data": {"step": 5, "train_loss": 1.0}}, {"data": {"step": "x", "loss": 3}}, {"data": None})])
    assert sorted(curve.points) == [1, 2, 3, 4, 5]
    out = curve.save_png(tmp_path / "loss.png", "job")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eta_from_real_step_times_only():
    rate = StepRate()
    job = Job.from_api({"status": "running", "progress": {"step": 10, "total_steps": 110}})
    assert eta_text(job, rate, now=100.0) == "-"
    job = Job.from_api({"status": "running", "progress": {"step": 20, "total_steps": 110}})
    assert eta_text(job, rate, now=110.0) == "1:30"   # 10 steps per 10 s, 90 steps left
    # the trainer's measured seconds per step win
    assert eta_text(Job.from_api({"status": "running", "progress": {"step": 20, "total_steps": 110,
                                                                    "step_time_s": 2.0}}), StepRate(), now=0) == "3:00"
    smoothed = StepRate()
    eta_text(Job.from_api({"status": "running", "progress": {"step": 20, "total_steps": 110, "step_time_s": 2.0}}),
             smoothed, 0)
    assert eta_text(Job.from_api({"status": "running", "progress": {"step": 30, "total_steps": 110,
                                                                    "step_time_s": 4.0}}),
                    smoothed, 0) == "3:28"   # 80 steps x (0.3 x 4 + 0.7 x 2 = 2.6) s, not a jump to 5:20
    # none during set-up or in the queue, whatever the platform's own estimate says
    for job in ({"status": "queued", "estimated_finish": 10**10, "progress": {}},
                {"status": "running", "state": "provisioning", "progress": {"total_steps": 40}},
                {"status": "running", "progress": {"step": 0, "total_steps": 40, "step_time_s": 1.0}}):
        assert eta_text(Job.from_api(job), StepRate(), now=0) == "-"


def test_progress_lines_never_show_none_and_label_the_eta():
    from whetstone.cli.follow import progress_text
    from whetstone.cli.jobs_cli import job_line

    base = {"id": "ftjob-1", "model": "tiny-llama", "training_file": "ds-1", "created_at": 1}
    setting_up = {**base, "status": "running", "state": "provisioning", "progress": {"total_steps": None}}
    assert "None" not in progress_text(Job.from_api(setting_up), "-", 3)
    assert "step" not in job_line(Job.from_api(setting_up))
    assert "waiting for the first step" in progress_text(Job.from_api(setting_up), "-", 3)
    running = {**base, "status": "running", "progress": {"step": 5, "total_steps": None, "loss": 1.5}}
    assert "step 5 " in progress_text(Job.from_api(running), "-", 3) + " "
    assert "None" not in job_line(Job.from_api(running))
    line = progress_text(Job.from_api({**running, "progress": {"step": 5, "total_steps": 40, "loss": 1.5}}),
                         "0:35", 65)
    assert line.split()[1:] == ["step", "5/40", "loss", "1.5000", "ETA", "0:35", "elapsed", "1:05"]


def test_non_terminal_output_prints_one_line_per_update(capsys):
    import io

    from whetstone.cli.follow import follow

    states = iter([
        {"id": "j", "status": "queued", "progress": {}},
        {"id": "j", "status": "queued", "progress": {}},
        {"id": "j", "status": "running", "state": "provisioning", "progress": {"total_steps": 4}},
        {"id": "j", "status": "running", "progress": {"step": 2, "total_steps": 4, "loss": 2.0, "step_time_s": 1}},
        {"id": "j", "status": "running", "progress": {"step": 2, "total_steps": 4, "loss": 2.0, "step_time_s": 1}},
        {"id": "j", "status": "succeeded", "progress": {"step": 4, "total_steps": 4, "loss": 1.0}},
    ])

    class FakeApi:
        def get(self, path):
            return next(states)

    out = io.StringIO()
    job, raw = follow(FakeApi(), "j", poll_s=0, stream=out)
    lines = out.getvalue().splitlines()
    assert job.status == "succeeded" and len(lines) == 4, lines
    assert raw == {"id": "j", "status": "succeeded", "progress": {"step": 4, "total_steps": 4, "loss": 1.0}}
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert "ETA 0:02" in lines[2] and "step 2/4" in lines[2]


def test_every_option_and_command_has_help():
    from whetstone.cli.main import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                for name, sub in action.choices.items():
                    assert name in helped, f"{path} {name}: no help"
                    yield from walk(sub, f"{path} {name}")
            elif action.option_strings and action.dest != "help":
                yield path, action

    missing = [f"{path} {'/'.join(a.option_strings)}" for path, a in walk(build_parser(), "whet") if not a.help]
    assert not missing, missing


def test_no_traceback_reaches_the_user(monkeypatch, capsys):
    from whetstone.cli.main import main

    monkeypatch.setenv("WHETSTONE_API_KEY", "wsk-x")
    monkeypatch.setenv("WHETSTONE_BASE_URL", "http://127.0.0.1:9/v1")   # nothing listens on port 9
    assert main(["jobs", "list"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "127.0.0.1:9" in err, err


def test_a_broken_pipe_and_ctrl_c_end_in_one_line_and_an_exit_code(capsys, monkeypatch):
    from whetstone.cli import errors

    monkeypatch.setattr(errors, "_detach_stdout", lambda: None)   # pytest owns stdout here

    def broken(argv):
        raise BrokenPipeError(32, "Broken pipe")

    def interrupted(argv):
        raise KeyboardInterrupt

    assert errors.guarded_main(broken, []) == errors.BROKEN_PIPE
    assert errors.guarded_main(interrupted, []) == errors.INTERRUPTED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["whet: output closed early (broken pipe)", "whet: interrupted"]


def test_a_real_broken_pipe_prints_no_traceback(tmp_path):
    import subprocess
    import sys

    # `whet datasets check FILE` printing its report into a pipe whose reader has gone
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join('{"messages": [{"role": "user", "content": "q%d"}, {"role": "assistant", "content": '
                            '"a%d"}]}\n' % (i, i) for i in range(12)))
    code = ("import os, sys\nr, w = os.pipe()\nos.close(r)\nos.dup2(w, 1)\n"
            f"from whetstone.cli.main import main\nsys.exit(main(['datasets', 'check', {str(rows)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "whet: output closed early (broken pipe)"


def test_stage_changes_without_a_reason_send_one_the_registry_accepts(monkeypatch, capsys):
    """`whet models promote|rollback|archive ID` alone: the body carries a default reason that the
    registry's request models accept (an empty one is a 400)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from whetstone.cli.main import main
    from whetstone.registry.entrypoints.api import PromoteRequest, ReasonRequest

    bodies: list[tuple[str, bytes]] = []

    class Registry(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            answer = json.dumps({"id": "m1", "object": "model", "created": 0, "owned_by": "demo",
                                 "stage": "production"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("WHETSTONE_BASE_URL", f"http://127.0.0.1:{server.server_port}/v1")
        monkeypatch.setenv("WHETSTONE_API_KEY", "sk-test")
        for action in ("promote", "rollback", "archive"):
            assert main(["models", action, "m1"]) == 0, capsys.readouterr().err
    finally:
        server.shutdown()
    assert [path for path, _ in bodies] == ["/v1/models/m1/promote", "/v1/models/m1/rollback", "/v1/models/m1/archive"]
    PromoteRequest.model_validate_json(bodies[0][1])
    for _, body in bodies[1:]:
        assert ReasonRequest.model_validate_json(body).reason
