"""The web console in headless Chromium against the real platform: sign in with a key,
upload files and read a refusal by its line number, start a job and watch its loss chart gain points
live, read the eval verdict, promote the model, sign out; another tenant sees none of it; CSRF,
read-only keys, revoked keys and hostile names."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from .conftest import key_for, sign_in

pytestmark = pytest.mark.e2e
DATASET = Path(__file__).resolve().parents[2] / "examples" / "datasets" / "chat_demo.jsonl"
# a file name keeps no "/" (ingest keeps the last path part), so the markup is one that needs none
# a dozen steps cannot be expected to beat the base by the default 5 %: the gate asks only for no loss
EVAL_CONFIG = json.dumps({"stages": {"benchmarks": False, "judge": False, "holdout": {"min_relative_improvement": 0}}})
HOSTILE = "<img src=x onerror=window.__pwned=1><b>bold"


def bad_file() -> bytes:
    good = json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]})
    return (good + "\n" + good.replace("Hi", "Hey") + "\n" + '{"messages": [{"role": "user", "content": "broken"\n'
            + good.replace("Hi", "Yo") + "\n").encode()


async def drop_file(page, selector: str, name: str, data: bytes, mime: str = "application/jsonl") -> None:
    """A real drop event carrying a File, as a drag from the desktop delivers it."""
    transfer = await page.evaluate_handle(
        """([name, text, mime]) => { const dt = new DataTransfer();
             dt.items.add(new File([text], name, { type: mime })); return dt; }""", [name, data.decode(), mime])
    await page.dispatch_event(selector, "drop", {"dataTransfer": transfer})


async def visit(page, where: str) -> None:
    """Go to a console page (`#/jobs`) and wait until it has rendered."""
    await page.evaluate("(h) => { location.hash = h; }", where)
    await page.wait_for_function("""(h) => { const v = document.querySelector('main > .view');
                                             return v && v.dataset.route === h && v.dataset.ready !== undefined; }""",
                                 arg=where)


async def reload_until(page, done_selector: str, timeout: float = 120) -> None:
    """The file page has no push channel: press its Reload button until `done_selector` shows."""
    deadline = time.monotonic() + timeout
    while True:
        await page.locator("main > .view[data-ready]").wait_for()
        if await page.locator(done_selector).count():
            return
        assert time.monotonic() < deadline, f"{done_selector} never showed"
        await asyncio.sleep(1)
        await page.get_by_role("button", name="Reload").click()


async def test_sign_in_upload_refusal_and_hostile_names(page, console):
    await sign_in(page, key_for(console, "demo"))
    assert await page.locator("#who").inner_text() != ""
    # the key is nowhere a script can read: not in cookies, localStorage or sessionStorage
    readable = await page.evaluate("() => document.cookie + JSON.stringify(localStorage) + JSON.stringify(sessionStorage)")
    assert key_for(console, "demo") not in readable and "whet_session" not in readable
    cookies = {c["name"]: c for c in await page.context.cookies()}
    assert cookies["whet_session"]["httpOnly"] and cookies["whet_session"]["sameSite"] == "Strict"

    await page.get_by_role("link", name="Files").click()
    await drop_file(page, "#drop-zone", f"{HOSTILE}.jsonl", bad_file())
    await page.wait_for_url("**/#/files/*")
    await reload_until(page, "#report table")
    details = page.locator("#status-details")
    assert "line 3" in await details.inner_text()
    errors = page.locator("section[aria-label=Errors] tbody tr")
    first = errors.first
    assert (await first.locator("td").nth(0).inner_text()).strip() == "3"
    assert '"content": "broken"' in await first.locator("td").nth(4).inner_text()   # the offending row itself
    # the hostile file name is shown as text and never ran
    assert HOSTILE in await page.locator("h1").inner_text()
    assert await page.evaluate("() => window.__pwned") is None and await page.locator("main b").count() == 0

    # the training file for the job test, through the file picker this time, with upload progress shown
    await page.get_by_role("link", name="Files").click()
    small = b"".join(DATASET.read_bytes().splitlines(keepends=True)[:48])   # a few training steps, not a hundred
    await page.locator("input[type=file]").set_input_files(
        {"name": "chat.jsonl", "mimeType": "application/jsonl", "buffer": small})
    await page.wait_for_url("**/#/files/*")
    await reload_until(page, "#report .ok")
    console.state["training_file"] = file_id = page.url.rsplit("/", 1)[-1]
    await visit(page, "#/files")
    assert await page.locator("#files-table tbody tr").count() == 2

    # a job named with markup (created and cancelled over the API): listed and shown as text
    async with httpx.AsyncClient(base_url=console.url, headers={"Authorization": f"Bearer {key_for(console, 'demo')}"}) as c:
        r = await c.post("/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": file_id,
                                                       "suffix": "<script>window.__pwned=3</script>"})
        assert r.status_code == 200, r.text
        hostile_job = r.json()["id"]
        await c.post(f"/v1/fine_tuning/jobs/{hostile_job}/cancel")
    await visit(page, "#/jobs")
    assert "<script>window.__pwned=3</script>" in await page.locator("#jobs-table").inner_text()
    await page.get_by_role("link", name=hostile_job).click()
    await page.wait_for_url(f"**/#/jobs/{hostile_job}")
    await page.locator("#job-summary").wait_for()
    assert "<script>window.__pwned=3</script>" in await page.locator("h1").inner_text()
    assert await page.evaluate("() => window.__pwned") is None and await page.locator("main b").count() == 0
    assert page.errors == []


async def test_job_chart_gains_points_live_then_verdict_and_promote(page, console):
    assert "training_file" in console.state, "needs the upload test's file"
    await sign_in(page, key_for(console, "demo"))
    await visit(page, f"#/jobs/new?training_file={console.state['training_file']}")
    await page.get_by_label("Method").select_option("lora")
    for name, value in {"Base model": "tiny-llama", "Epochs": "1", "Batch size": "4", "Learning-rate multiplier": "10",
                        "Max sequence length": "128", "Checkpoint every N steps": "4", "LoRA rank": "4", "Suffix (name)": "console",
                        "Eval config (JSON)": EVAL_CONFIG}.items():
        await page.get_by_label(name, exact=True).fill(value)
    preview = json.loads(await page.locator("#preview pre").first.inner_text())
    assert preview["method"]["supervised"]["hyperparameters"]["n_epochs"] == 1
    await page.locator("#create-job").click()
    await page.wait_for_url("**/#/jobs/ftjob-*")
    job_id = page.url.rsplit("/", 1)[-1]
    console.state["job_id"] = job_id
    chart = page.locator("svg.chart")
    assert int(await chart.get_attribute("data-points")) == 0    # nothing trained yet when the page opened
    # the points arrive over the event stream while the page stays open (no reload, no polling)
    await page.wait_for_function("() => +document.querySelector('svg.chart').dataset.points >= 2", timeout=240_000)
    seen = int(await chart.get_attribute("data-points"))
    await page.wait_for_function(f"() => +document.querySelector('svg.chart').dataset.points > {seen}", timeout=240_000)
    assert await chart.locator("polyline.train").count() == 1
    await page.wait_for_function("() => document.querySelector('#job-summary .status').textContent === 'succeeded'",
                                 timeout=420_000)
    await page.locator("#eval strong").wait_for(timeout=60_000)
    assert await page.locator("#eval strong").inner_text() == "passed", await page.locator("#eval").inner_text()
    assert await page.locator("#eval h3").count() >= 1           # stage by stage
    assert await page.locator("#checkpoints tbody tr").count() >= 1
    assert await page.evaluate("() => window.__pwned") is None

    # the registered model: promote it with a reason
    async with httpx.AsyncClient(base_url=console.url, headers={"Authorization": f"Bearer {key_for(console, 'demo')}"}) as c:
        deadline = time.monotonic() + 120
        while not (models := (await c.get("/v1/models", params={"job_id": job_id})).json()["data"]):
            assert time.monotonic() < deadline, "no model registered"
            await asyncio.sleep(1)
    model_id = models[0]["id"]
    console.state["model_id"] = model_id
    await page.get_by_role("link", name="Models").click()
    await page.get_by_role("link", name=model_id).click()
    await page.get_by_label("Target stage").select_option("production")
    await page.get_by_label("Reason").fill("console test: better holdout loss")
    await page.locator("#promote").click()
    await page.wait_for_function("() => document.querySelector('#model-stage').textContent === 'production'")

    # the playground: one prompt, the fine-tuned model and its base answering side by side, streamed
    await page.get_by_role("link", name="Try it in the playground").click()
    await page.get_by_label("Message").fill("Hello!")
    await page.locator("#play-send").click()
    for pane in ("#answer-model", "#answer-base"):
        await page.wait_for_function(f"() => document.querySelector('{pane}').dataset.done !== undefined", timeout=120_000)
        assert await page.locator(pane).get_attribute("data-done") == "ok", await page.locator(pane).inner_text()
    assert "tiny-llama" in await page.locator("main h2").nth(1).inner_text()
    assert page.errors == []


async def test_second_tenant_sees_nothing(page, console):
    await sign_in(page, key_for(console, "acme"))
    await visit(page, "#/files")
    assert "No files yet." in await page.locator("main").inner_text()
    await visit(page, "#/jobs")
    assert "No jobs yet." in await page.locator("main").inner_text()
    # opened afresh with its session, the page's data is asked for once, while the session is still checked
    await page.reload()
    await page.locator("main > .view[data-ready]").wait_for()
    session, listed = await page.evaluate("""() => [
        performance.getEntriesByType('resource').filter((e) => e.name.endsWith('/console/session')).map((e) => e.responseEnd),
        performance.getEntriesByType('resource').filter((e) => e.name.includes('/v1/fine_tuning/jobs?')).map((e) => e.startTime)]""")
    assert len(session) == 1 and len(listed) == 1 and listed[0] < session[0], (session, listed)
    assert "No jobs yet." in await page.locator("main").inner_text()
    await visit(page, "#/models")   # the shared base models are listed for every tenant; demo's model is not
    text = await page.locator("main").inner_text()
    assert "ft:" not in text and console.state.get("model_id", "ft:") not in text and ":demo:" not in text, text
    if "job_id" in console.state:   # demo's job by its id: not found, nothing of it shown
        await visit(page, f"#/jobs/{console.state['job_id']}")
        text = await page.locator("main").inner_text()
        assert "Could not load this page: No fine-tuning job found" in text and "Loss" not in text, text
    if "model_id" in console.state:
        await visit(page, f"#/models/{console.state['model_id']}")
        assert "Could not load this page" in await page.locator("main").inner_text()


async def test_csrf_read_only_and_bearer(page, console):
    await sign_in(page, key_for(console, "demo"))
    jar = page.context.request
    job = console.state.get("job_id", "ftjob-none")
    missing = await jar.post(f"/v1/fine_tuning/jobs/{job}/cancel")
    assert missing.status == 403 and (await missing.json())["error"]["code"] == "csrf_failed"
    forged = await jar.post(f"/v1/fine_tuning/jobs/{job}/cancel", headers={"X-CSRF-Token": "forged"})
    assert forged.status == 403 and (await forged.json())["error"]["code"] == "csrf_failed"
    out = await jar.delete("/console/session", headers={"X-CSRF-Token": "forged"})
    assert out.status == 403
    cross = await jar.post("/v1/files", headers={"X-CSRF-Token": await page.evaluate(
        "() => document.cookie.match(/whet_csrf=([^;]+)/)[1]"), "Origin": "https://evil.example"}, multipart={"purpose": "fine-tune"})
    assert cross.status == 403
    assert (await jar.get("/v1/files")).status == 200                 # reads need no token
    # Bearer-authenticated calls are not cookie-authenticated: no token needed
    async with httpx.AsyncClient(base_url=console.url) as c:
        r = await c.post(f"/v1/fine_tuning/jobs/{job}/cancel", headers={"Authorization": f"Bearer {key_for(console, 'demo')}"})
        assert r.status_code in (404, 409), r.text                   # reached the scheduler: not a CSRF refusal

    # a read-only key sees no button that would fail
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_label("API key").wait_for()
    await sign_in(page, key_for(console, "demo-read"))
    await visit(page, "#/files")
    assert await page.locator("#files-table tbody tr").count() >= 2 and await page.locator("#drop-zone").count() == 0
    await visit(page, "#/jobs")
    assert await page.locator("#jobs-table").count() == 1 and await page.locator("#new-job").count() == 0
    if "job_id" in console.state:
        await visit(page, f"#/jobs/{console.state['job_id']}")
        assert await page.locator("#job-summary").count() == 1 and await page.locator("#job-actions button").count() == 0
    if "model_id" in console.state:
        await visit(page, f"#/models/{console.state['model_id']}")
        assert await page.locator("#model-stage").count() == 1
        assert await page.get_by_role("button", name="Promote").count() == 0


async def test_revoked_key_mid_session_and_sign_out(page, console):
    from whetstone.cli.keys import operator_call

    await sign_in(page, key_for(console, "doomed"))
    await visit(page, "#/files")
    session = next(c for c in await page.context.cookies() if c["name"] == "whet_session")
    await asyncio.to_thread(operator_call, "POST", f"/v1/keys/{console.keys['doomed']['id']}/revoke",
                            base_url=console.scheduler)
    await asyncio.sleep(2.5)   # the gateway's key cache lives at most 2 s
    await page.get_by_role("link", name="Jobs").click()
    await page.get_by_text("Your session ended").wait_for()
    assert await page.locator("#sign-out").count() == 0
    # the old cookie is dead for good, even replayed by hand
    async with httpx.AsyncClient(base_url=console.url, cookies={"whet_session": session["value"]}) as c:
        assert (await c.get("/v1/files")).status_code == 401
        assert (await c.get("/console/session")).status_code == 401

    # sign out revokes the session server-side: its cookie replayed afterwards gets nothing
    await sign_in(page, key_for(console, "demo"))
    session = next(c for c in await page.context.cookies() if c["name"] == "whet_session")
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_label("API key").wait_for()
    async with httpx.AsyncClient(base_url=console.url, cookies={"whet_session": session["value"]}) as c:
        assert (await c.get("/v1/files")).status_code == 401


async def test_report_with_100k_warnings_stays_usable(page, console):
    """The report renderer in the browser, fed a report with 100,000 warnings (the API lists fewer; the
    console must not rely on it): one page of rows is rendered, and paging works."""
    await sign_in(page, key_for(console, "demo"))
    elapsed_ms, rows, status = await page.evaluate("""async () => {
        const { renderReport } = await import('/console/static/js/report.js');
        const warnings = Array.from({ length: 100000 }, (_, i) => ({ code: 'near_duplicate', line: i + 1,
                                                                      message: `<b>row ${i + 1}</b>` }));
        const file = { status: 'processed', validation: { status: 'accepted', rows_total: 100000, rows_kept: 100000,
                       error_count: 0, errors: [], warnings, stats: {} } };
        const box = document.createElement('div');
        document.getElementById('main').replaceChildren(box);
        const t0 = performance.now();
        renderReport(box, file, null);
        const ms = performance.now() - t0;
        box.querySelector('section[aria-label=Warnings] button:nth-of-type(2)').click();
        return [ms, box.querySelectorAll('tbody tr').length, box.querySelector('.pager span').textContent];
    }""")
    assert rows <= 60 and "page 2 of 2000" in status, status
    assert elapsed_ms < 1000, elapsed_ms
    assert await page.locator("b").count() == 0     # the messages' markup stayed text


async def test_usage_and_admin_pages(page, console):
    """Usage: the month's invoice and the trained job's metered line; keys and webhooks only for admin keys."""
    await sign_in(page, key_for(console, "demo"))
    assert await page.locator("#nav a[href='#/keys']").is_hidden()
    await visit(page, "#/usage")
    text = await page.locator("main").inner_text()
    assert "GPU hours" in text and await page.locator("#usage-chart").count() == 1
    if "job_id" in console.state:
        assert console.state["job_id"] in text, text
    await page.get_by_role("button", name="Sign out").click()
    await sign_in(page, key_for(console, "demo-admin"))
    await visit(page, "#/keys")
    text = await page.locator("main").inner_text()
    assert console.keys["demo-read"]["id"] in text and console.keys["acme"]["id"] not in text
    assert page.errors == []


async def test_models_page_shows_ab_routes_with_split_and_counts(page, console):
    """An A/B route over the trained version: the models page lists it with its traffic split and the
    requests each version served, counted by serving as the official client's calls go through it."""
    from openai import AsyncOpenAI

    assert "model_id" in console.state, "needs the job test's promoted model"
    key = key_for(console, "demo")
    async with httpx.AsyncClient(base_url=console.url, headers={"Authorization": f"Bearer {key}"}) as c:
        version = (await c.get(f"/v1/models/{console.state['model_id']}")).json()["model_id"]
        r = await c.put("/v1/serving/routes/console-ab", json={"variants": [{"model": version, "weight": 3}]})
        assert r.status_code == 200, r.text
    client = AsyncOpenAI(base_url=f"{console.url}/v1", api_key=key, max_retries=0)
    for i in range(2):
        await client.chat.completions.create(model="console-ab", messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=2, user=f"u{i}")
    await client.close()
    await sign_in(page, key)
    await visit(page, "#/models")
    rows = page.locator("#routes-table tbody tr")
    assert await rows.count() == 1
    cells = [await rows.first.locator("td").nth(i).inner_text() for i in range(5)]
    assert cells[0] == "console-ab" and cells[1] == version and cells[2] == "100.0 %", cells
    assert cells[3] == "2" and cells[4] == "100.0 %", cells
    await page.get_by_role("link", name=version).first.click()      # the version's page lists the route too
    await page.locator("#model-stage").wait_for()
    assert "console-ab" in await page.locator("#ab-routes").inner_text()
    # another tenant lists none of it
    async with httpx.AsyncClient(base_url=console.url, headers={"Authorization": f"Bearer {key_for(console, 'acme')}"}) as c:
        assert (await c.get("/v1/serving/routes")).json()["data"] == []
    assert page.errors == []


async def test_operator_view_queue_nodes_and_dead_letter_redrive(page, console):
    """A `platform` admin key sees the queue by tier, the nodes with their GPUs and the dead letters, and
    redrives a topic's letters; a tenant's admin key gets the API's 403 and the page shows none of it."""
    from whetstone.cli.keys import create_key, operator_call
    from whetstone.contracts import NodeHeartbeatV1
    from whetstone.devstack.testing import send
    from whetstone.runtime.delivery import dead_letter
    from whetstone.runtime.messaging import encode, make_envelope
    from whetstone.runtime.settings import resolve_settings

    # a tenant's admin: no link, and the page says the API refused it
    await sign_in(page, key_for(console, "demo-admin"))
    assert await page.locator("#nav a[href='#/operator']").is_hidden()
    await visit(page, "#/operator")
    assert "operator_only" not in await page.locator("main").inner_text()
    assert "refused" in await page.locator("#operator-denied").inner_text()
    assert await page.locator("#queue-table, #nodes-table, #dlq-table").count() == 0
    for path in ("/v1/operator/queue", "/v1/operator/nodes", "/v1/operator/dead_letters"):
        r = await page.context.request.get(path)
        assert r.status == 403 and (await r.json())["error"]["code"] == "operator_only", path
    await page.get_by_role("button", name="Sign out").click()

    # two letters for node.heartbeat as the runtime writes them: a heartbeat (replayable) and a malformed record
    bootstrap = resolve_settings().kafka_bootstrap
    beat = make_envelope(NodeHeartbeatV1(node_id="op-test-node", gpu_type="cpu", gpu_count=0,
                                         sent_at=datetime.now(UTC)), producer="test", tenant_id="platform")
    for raw in (encode(beat), b"\x00not an envelope"):
        letter = dead_letter("node.heartbeat", 0, 0, "scheduler", 3, "RuntimeError: test", "op-test-node", raw)
        await send(bootstrap, "node.heartbeat.dlq", encode(make_envelope(letter, producer="test", tenant_id="platform",
                                                                          key="op-test-node")), key="op-test-node")

    operator = await asyncio.to_thread(create_key, "platform", name="operator", scopes=["admin"],
                                       base_url=console.scheduler)
    await sign_in(page, operator["key"])
    await page.get_by_role("link", name="Operator").click()
    await page.locator("#dlq-table").wait_for()
    tiers = await page.locator("#queue-table tbody tr td:first-child").all_inner_texts()
    assert tiers[:3] == ["premium", "standard", "free"], tiers
    nodes = page.locator("#nodes-table tbody tr")
    assert await nodes.count() >= 1 and " / " in await nodes.first.locator("td").nth(2).inner_text()
    row = page.locator("#dlq-table tbody tr", has=page.locator("code", has_text="node.heartbeat"))
    assert [await row.locator("td").nth(i).inner_text() for i in (1, 2)] == ["2", "1"]
    await page.get_by_role("button", name="Redrive node.heartbeat").click()
    result = page.locator("#redrive-result")
    await page.wait_for_function("() => document.querySelector('#redrive-result').textContent !== ''")
    text = await result.inner_text()
    assert text.startswith("Redriven 1 letter(s) to node.heartbeat; skipped 1") and "not a valid envelope" in text, text
    # the redriven heartbeat went through the scheduler's inbox: its node is listed
    deadline = time.monotonic() + 30
    while not await page.locator("#nodes-table code", has_text="op-test-node").count():
        assert time.monotonic() < deadline, "the redriven heartbeat's node never showed"
        await asyncio.sleep(0.5)
        await visit(page, "#/jobs")
        await visit(page, "#/operator")
    assert page.errors == []
    # the internal secret reads the same routes on the scheduler's own port (an operator's script)
    queue = await asyncio.to_thread(operator_call, "GET", "/v1/operator/queue", base_url=console.scheduler)
    assert [t["tier"] for t in queue["tiers"]][:3] == ["premium", "standard", "free"]


def test_index_preloads_every_module():
    """index.html names every console module in a modulepreload link (one round of fetches, not one per
    import level): a module added without its link would load late."""
    import re

    static = Path(__file__).resolve().parents[2] / "services/gateway/src/whetstone/gateway/console/static"
    modules = {p.relative_to(static).as_posix() for p in (static / "js").rglob("*.js")} - {"js/app.js"}
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/console/static/([^"]+)">',
                               (static / "index.html").read_text()))
    assert preloaded == modules
