"""Template builds through E2B's API (`Template.build`, `build_in_background`,
`get_build_status`, `exists`) on Sandlot's native image builds: a template is an
image of the API key's tenant, tagged with its name in that tenant's namespace,
and `Sandbox.create(template=NAME)` starts from it."""

import gzip
import io
import secrets
import tarfile
import time

import httpx
import pytest
from e2b import BuildException, Sandbox, SandboxException, SandboxQuery, Template, wait_for_file


def alias() -> str:
    return f"tmpl-{secrets.token_hex(4)}"


def test_a_template_built_from_the_base_image_is_an_image_sandboxes_start_from(server, tmp_path):
    (tmp_path / "hello.txt").write_text("hello from the build\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.ini").write_text("a\n")
    (tmp_path / "conf" / "b.ini").write_text("b\n")
    t = (
        Template(file_context_path=str(tmp_path))
        .from_base_image()
        .run_cmd("echo step-output; mkdir -p /home/user/work")
        .copy("hello.txt", "/home/user/work/")
        .copy("conf/*.ini", "conf")
        .set_workdir("/home/user/work")
        .set_envs({"TEMPLATE_MODE": "built", "SPACED": "two words"})
        .run_cmd("cat hello.txt > copied-by-run.txt")
    )
    name = alias()
    logs = []
    info = Template.build(t, name, on_build_logs=logs.append)
    assert info.name == name
    messages = [str(entry.message) for entry in logs]
    assert any("step-output" in m for m in messages), messages
    assert any("Uploaded 'hello.txt'" in m for m in messages), messages
    assert Template.exists(name)
    assert not Template.exists(alias())

    sb = Sandbox.create(template=name, timeout=60)
    try:
        assert sb.get_info().template_id == name
        assert sb.files.read("/home/user/work/hello.txt") == "hello from the build\n"
        # A wildcard copy: every match into the destination (relative to the workdir then).
        assert sb.files.read("/home/user/conf/a.ini") == "a\n"
        assert sb.files.read("/home/user/conf/b.ini") == "b\n"
        r = sb.commands.run(
            "echo $TEMPLATE_MODE; echo $SPACED; cat /home/user/work/copied-by-run.txt; whoami; find /home/user/work/hello.txt -printf '%u\\n'; pwd"
        )
        assert r.stdout.splitlines() == [
            "built",
            "two words",
            "hello from the build",
            "user",
            "user",
            "/home/user/work",
        ], r.stdout
    finally:
        sb.kill()

    # It is an image of the tenant, tagged with the template's name in its namespace.
    images = server.native("GET", "/v1/images", server.key)["images"]
    mine = [i for i in images if f"{name}:latest" in i["tags"]]
    assert len(mine) == 1, images
    others = server.native("GET", "/v1/images", server.key_b)["images"]
    assert all(f"{name}:latest" not in i["tags"] for i in others)


def test_a_build_in_the_background_reports_its_status_and_logs(server, tmp_path):
    t = Template(file_context_path=str(tmp_path)).from_template("base").run_cmd("echo background-build")
    name = alias()
    info = Template.build_in_background(t, f"{name}:v1", tags=["stable"])
    assert sorted(info.tags) == ["stable", "v1"]
    deadline = time.monotonic() + 300
    entries = []
    while True:
        st = Template.get_build_status(info, logs_offset=len(entries))
        entries += st.log_entries
        if st.status.value in ("ready", "error") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert st.status.value == "ready", st
    assert st.build_id == info.build_id and st.template_id == name
    assert any("background-build" in e.message for e in entries), entries
    # Every name the build was given starts the same image.
    assert Template.exists(f"{name}:v1") and Template.exists(f"{name}:stable")
    sb = Sandbox.create(template=f"{name}:stable", timeout=30)
    sb.kill()
    # Tags are assigned to and removed from the tenant's names.
    assigned = Template.assign_tags(f"{name}:v1", ["prod", "canary"])
    assert sorted(assigned.tags) == ["canary", "prod"] and assigned.build_id
    assert Template.exists(f"{name}:prod")
    assert not Template.exists(f"{name}:prod", api_key=server.key_b)
    listed = Template.get_tags(name)
    assert {t.tag for t in listed} == {"v1", "stable", "prod", "canary"}, listed
    assert {t.build_id for t in listed} == {assigned.build_id}
    Template.remove_tags(name, "prod")
    assert not Template.exists(f"{name}:prod") and Template.exists(f"{name}:canary")
    assert {t.tag for t in Template.get_tags(name)} == {"v1", "stable", "canary"}
    # Another tenant sees none of them.
    with pytest.raises(Exception, match="not found"):
        Template.get_tags(name, api_key=server.key_b)
    with pytest.raises(Exception, match="not found"):
        Template.assign_tags(f"{name}:v1", "mine", api_key=server.key_b)


def test_a_failing_run_cmd_is_a_build_error_naming_the_step(server, tmp_path):
    t = (
        Template(file_context_path=str(tmp_path))
        .from_base_image()
        .run_cmd("echo fine")
        .run_cmd("echo about to fail >&2; exit 3")
        .run_cmd("echo never")
    )
    name = alias()
    logs = []
    with pytest.raises(BuildException, match=r"step 2 \(RUN .*exit 3\) failed: exit code 3"):
        Template.build(t, name, on_build_logs=logs.append)
    assert any("about to fail" in str(e.message) for e in logs)
    assert not any(str(e.message) == "never" for e in logs)
    assert not Template.exists(name)


def test_a_template_with_a_start_command_starts_its_sandboxes_with_it(server, tmp_path):
    t = (
        Template(file_context_path=str(tmp_path))
        .from_base_image()
        .set_start_cmd("echo started-$(whoami) > /tmp/started; sleep 600", wait_for_file("/tmp/started"))
    )
    name = alias()
    Template.build(t, name)
    sb = Sandbox.create(template=name, timeout=60)
    try:
        # Ready means the ready command succeeded: the file is there at once.
        assert sb.files.read("/tmp/started") == "started-user\n"
        assert any("sleep 600" in " ".join([c.cmd, *c.args]) for c in sb.commands.list())
    finally:
        sb.kill()
    # A ready command that never succeeds fails the create, and no sandbox stays.
    never = alias()
    Template.build(Template(file_context_path=str(tmp_path)).from_base_image().set_start_cmd("sleep 600", "false"), never)
    with pytest.raises(SandboxException, match="ready command did not succeed"):
        Sandbox.create(template=never, timeout=3)
    assert not Sandbox.list(query=SandboxQuery(template=never)).next_items()


def test_another_tenant_neither_sees_nor_uses_the_template(server, tmp_path):
    name = alias()
    info = Template.build(Template(file_context_path=str(tmp_path)).from_base_image().run_cmd("true"), name)
    assert Template.exists(name)
    assert not Template.exists(name, api_key=server.key_b)
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(template=name, api_key=server.key_b)
    with pytest.raises(Exception, match="not found"):
        Template.get_build_status(info, api_key=server.key_b)
    # The other tenant's template of the same name is its own.
    Template.build(
        Template(file_context_path=str(tmp_path)).from_base_image().set_envs({"WHOSE": "b"}),
        name,
        api_key=server.key_b,
    )
    a = Sandbox.create(template=name, timeout=30)
    b = Sandbox.create(template=name, timeout=30, api_key=server.key_b)
    try:
        assert a.commands.run("echo ${WHOSE:-a}").stdout == "a\n"
        assert b.commands.run("echo ${WHOSE:-a}").stdout == "b\n"
    finally:
        a.kill()
        b.kill()


def test_bad_template_steps_are_refused_naming_the_problem(server, tmp_path):
    with pytest.raises(BuildException, match="not in this server's image store.*does not pull"):
        Template.build(Template(file_context_path=str(tmp_path)).from_image("python:3.12").run_cmd("true"), alias())

    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=30)
    h = "ab" * 32
    for steps, problem in [
        ([{"type": "RUN", "args": ["true"]}, {"type": "EXPOSE", "args": ["80"]}], 'steps[1].type: unknown step type "EXPOSE"'),
        ([{"type": "COPY", "args": ["a.txt", "/home/user/../../etc/cron.d/x", "", ""], "filesHash": h}], "copy destination"),
        ([{"type": "COPY", "args": ["../a.txt", "/x", "", ""], "filesHash": h}], "copy source"),
        ([{"type": "COPY", "args": ["a.txt", "/x", "", ""], "filesHash": h}], "not uploaded"),
    ]:
        name = alias()
        r = api.post("/v3/templates", json={"name": name})
        assert r.status_code == 202, r.text
        build = r.json()["buildID"]
        r = api.post(f"/v2/templates/{name}/builds/{build}", json={"fromImage": "e2bdev/base", "steps": steps})
        assert r.status_code == 400 and problem in r.json()["message"], r.text
        # The refused build has ended (its place among the tenant's builds is free).
        st = api.get(f"/templates/{name}/builds/{build}/status").json()
        assert st["status"] == "error" and problem in st["reason"]["message"], st


def tar_gz(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_uploads_are_bound_to_their_build_and_hostile_tars_are_refused(server):
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=60)
    name = alias()
    r = api.post("/v3/templates", json={"name": name})
    assert r.status_code == 202, r.text
    build = r.json()["buildID"]
    link = api.get(f"/templates/{name}/files/{'cd' * 32}")
    assert link.status_code == 201, link.text
    url = link.json()["url"]
    assert url.startswith(server.url + "/"), url
    # Another tenant has no build of this template to upload to.
    other = httpx.get(f"{server.url}/templates/{name}/files/{'cd' * 32}", headers={"X-API-Key": server.key_b})
    assert other.status_code == 404
    # A guessed token reaches nothing.
    assert httpx.put(server.url + "/e2b-uploads/" + "0" * 64, content=b"x").status_code == 404

    r = httpx.put(url, content=tar_gz([("../escape.txt", b"out")]))
    assert r.status_code == 400 and "escapes the build context" in r.json()["message"], r.text
    # A header that claims more than the operator's limit (64M here), as a
    # small gzip of zeros: refused naming the limit, nothing unpacked.
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb", compresslevel=1) as z:
        ti = tarfile.TarInfo("bomb")
        ti.size = 200 << 20
        z.write(ti.tobuf(format=tarfile.GNU_FORMAT))
        chunk = b"\0" * (1 << 20)
        for _ in range(200):
            z.write(chunk)
    r = httpx.put(url, content=bomb.getvalue())
    assert r.status_code == 400 and "images.max_expanded_size" in r.json()["message"], r.text
    # A good upload goes through once; the URL is spent after it.
    r = httpx.put(url, content=tar_gz([("ok.txt", b"fine\n")]))
    assert r.status_code == 200, r.text
    # The build's uploads together are bounded as one build context is: two of
    # 40M each do not fit 64M.
    big = []
    for h in ("e1" * 32, "e2" * 32):
        link = api.get(f"/templates/{name}/files/{h}").json()
        big.append(httpx.put(link["url"], content=tar_gz([("big", bytes(40 << 20))])))
    assert big[0].status_code == 200, big[0].text
    assert big[1].status_code == 400 and "images.max_expanded_size" in big[1].json()["message"], big[1].text
    assert httpx.put(url, content=tar_gz([("ok.txt", b"again\n")])).status_code == 404
    assert api.get(f"/templates/{name}/files/{'cd' * 32}").json() == {"present": True}
    # The build copies what was uploaded.
    r = api.post(
        f"/v2/templates/{name}/builds/{build}",
        json={"fromTemplate": "base", "steps": [{"type": "COPY", "args": ["ok.txt", "/tmp/"], "filesHash": "cd" * 32}]},
    )
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 300
    while (st := api.get(f"/templates/{name}/builds/{build}/status").json())["status"] == "building":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert st["status"] == "ready", st
    sb = Sandbox.create(template=name, timeout=30)
    try:
        assert sb.files.read("/tmp/ok.txt") == "fine\n"
    finally:
        sb.kill()


def test_concurrent_uploads_never_take_more_than_the_builds_budget(server):
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=60)
    name = alias()
    r = api.post("/v3/templates", json={"name": name})
    assert r.status_code == 202, r.text
    urls = [api.get(f"/templates/{name}/files/{h}").json()["url"] for h in ("a1" * 32, "a2" * 32)]
    # Each fits the operator's 64M, both together do not.
    payload = tar_gz([("big", bytes(40 << 20))])
    hostile = tar_gz([("../escape.txt", b"out")])
    seen = []

    def slow_first():
        yield payload[: 64 << 10]
        # While the first upload is received, the second is refused (a refused
        # hostile tar would leave its URL usable: the 409 is what is waited for).
        for _ in range(200):
            r = httpx.put(urls[1], content=hostile)
            seen.append(r.status_code)
            if r.status_code == 409:
                break
            time.sleep(0.05)
        yield payload[64 << 10 :]

    first = httpx.put(urls[0], content=slow_first(), timeout=120)
    assert first.status_code == 200, first.text
    assert seen[-1] == 409, seen
    # After it, what is left of the budget bounds the second.
    r = httpx.put(urls[1], content=payload, timeout=120)
    assert r.status_code == 400 and "images.max_expanded_size" in r.json()["message"], r.text


def test_a_request_naming_too_many_tags_is_refused(server):
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=60)
    tags = [f"t{i}" for i in range(65)]
    r = api.post("/v3/templates", json={"name": alias(), "tags": tags})
    assert r.status_code == 400 and "at most 64" in r.json()["message"], r.text
    r = api.post("/templates/tags", json={"target": f"{alias()}:latest", "tags": tags})
    assert r.status_code == 400 and "at most 64" in r.json()["message"], r.text


def templates_api(api_key: str):
    """The official SDK's generated client (its models parse the answers)."""
    from e2b.api.client_sync import get_api_client
    from e2b.connection_config import ConnectionConfig

    return get_api_client(ConnectionConfig(api_key=api_key))


def test_a_tenants_templates_are_listed_shown_and_deleted_and_no_one_elses(server, tmp_path):
    from e2b.api.client.api.templates import (
        delete_templates_template_id,
        get_templates,
        get_templates_template_id,
        get_v2_templates,
    )
    from e2b.api.client.models import Template as TemplateModel, TemplateWithBuilds

    name, theirs = alias(), alias()
    Template.build(
        Template(file_context_path=str(tmp_path)).from_base_image().run_cmd("echo kept > /tmp/from-template"),
        name,
    )
    Template.build(Template(file_context_path=str(tmp_path)).from_base_image().run_cmd("true"), theirs, api_key=server.key_b)
    mine, other = templates_api(server.key), templates_api(server.key_b)
    # A second template of the caller's, known by its build that waits for files.
    extra = alias()
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=30)
    assert api.post("/v3/templates", json={"name": extra}).status_code == 202

    # Listed (v1 and v2), in E2B's shape: the caller's own, never another
    # tenant's, nor the operator's (public) ones.
    res = get_templates.sync_detailed(client=mine)
    assert res.status_code == 200, res.content
    listed = {t.template_id: t for t in res.parsed}
    assert all(isinstance(t, TemplateModel) for t in res.parsed)
    assert name in listed and theirs not in listed, listed.keys()
    assert "base" not in listed and "rooty" not in listed
    t = listed[name]
    assert (t.names, t.aliases, t.public, t.build_status.value) == ([name], [name], False, "ready")
    assert (t.created_by, t.spawn_count, t.last_spawned_at) == (None, 0, None)
    assert t.build_count == 1 and t.cpu_count >= 1 and t.memory_mb == 512 and t.envd_version
    assert theirs in {t.template_id for t in get_templates.sync_detailed(client=other).parsed}
    pages = get_v2_templates.sync_detailed(client=mine, limit=1)
    assert pages.status_code == 200 and len(pages.parsed) == 1, pages.content
    assert pages.headers.get("x-next-token"), pages.headers
    every, token = [], None
    while True:
        page = get_v2_templates.sync_detailed(client=mine, limit=1, next_token=token)
        every += [t.template_id for t in page.parsed]
        token = page.headers.get("x-next-token")
        if not token:
            break
    assert every == sorted(listed) and extra in every, every
    assert listed[extra].build_status.value == "waiting"
    assert api.delete(f"/templates/{extra}").status_code == 204

    # Shown with its builds; another tenant's, the operator's and unknown ones are 404.
    res = get_templates_template_id.sync_detailed(name, client=mine)
    assert res.status_code == 200, res.content
    shown = TemplateWithBuilds.from_dict(res.parsed.to_dict())
    assert shown.template_id == name and [b.status.value for b in shown.builds] == ["ready"]
    assert str(shown.builds[0].build_id) == t.build_id
    for key, tid in [(server.key, theirs), (server.key, "base"), (server.key, alias()), (server.key_b, name)]:
        r = httpx.get(f"{server.url}/templates/{tid}", headers={"X-API-Key": key})
        assert r.status_code == 404 and "not found" in r.json()["message"], (tid, r.text)

    # Another tenant's delete is "not found" and leaves it; so is a delete of
    # the operator's template.
    assert delete_templates_template_id.sync_detailed(name, client=other).status_code == 404
    assert delete_templates_template_id.sync_detailed("base", client=mine).status_code == 404
    assert Template.exists(name)

    def image_ids():
        return {i["id"] for i in server.native("GET", "/v1/images", server.key)["images"]}

    built = [i["id"] for i in server.native("GET", "/v1/images", server.key)["images"] if f"{name}:latest" in i["tags"]]
    assert len(built) == 1
    sb = Sandbox.create(template=name, timeout=60)
    try:
        r = delete_templates_template_id.sync_detailed(name, client=mine)
        assert r.status_code == 204, r.content
        assert not Template.exists(name)
        with pytest.raises(SandboxException, match="not found"):
            Sandbox.create(template=name, timeout=30)
        assert name not in {t.template_id for t in get_templates.sync_detailed(client=mine).parsed}
        assert get_templates_template_id.sync_detailed(name, client=mine).status_code == 404
        assert delete_templates_template_id.sync_detailed(name, client=mine).status_code == 404
        # The sandbox started from it keeps running on its files, and holds its image.
        assert sb.commands.run("cat /tmp/from-template").stdout == "kept\n"
        assert built[0] in image_ids()
    finally:
        sb.kill()
    # The image goes once its last sandbox has ended.
    deadline = time.monotonic() + 30
    while built[0] in image_ids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert built[0] not in image_ids()
    # None of its names is left; the other tenant's template stays.
    images = server.native("GET", "/v1/images", server.key)["images"]
    assert all(not any(tag.startswith(f"{name}:") for tag in i["tags"]) for i in images)
    assert Template.exists(theirs, api_key=server.key_b)
    assert delete_templates_template_id.sync_detailed(theirs, client=other).status_code == 204


def test_template_ids_that_are_not_names_are_refused_naming_the_problem(server):
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=30)
    for tid, problem in [
        ("my-app:v1", "without a tag"),
        ("..%2F..%2Fetc", "repository components"),
        ("Bad%20Name", "repository components"),
    ]:
        for method in ("GET", "DELETE"):
            r = api.request(method, f"/templates/{tid}")
            assert r.status_code == 400 and problem in r.json()["message"], (method, tid, r.text)
    r = api.get("/v2/templates", params={"limit": 0})
    assert r.status_code == 400 and "limit" in r.json()["message"], r.text


def test_a_template_is_not_deleted_while_its_build_runs_and_a_waiting_build_goes_with_it(server, tmp_path):
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": server.key}, timeout=60)
    name = alias()
    info = Template.build_in_background(
        Template(file_context_path=str(tmp_path)).from_base_image().run_cmd("sleep 4"), name
    )
    while Template.get_build_status(info).status.value != "building":
        time.sleep(0.1)
    r = api.delete(f"/templates/{name}")
    assert r.status_code == 409 and "running" in r.json()["message"], r.text
    listed = {t["templateID"]: t for t in api.get("/templates").json()}
    assert listed[name]["buildStatus"] == "building", listed.get(name)
    while Template.get_build_status(info).status.value == "building":
        time.sleep(0.2)
    assert Template.get_build_status(info).status.value == "ready"
    assert api.delete(f"/templates/{name}").status_code == 204
    assert not Template.exists(name)

    # A build requested and never started is dropped with its template.
    waiting = alias()
    r = api.post("/v3/templates", json={"name": waiting})
    assert r.status_code == 202, r.text
    build = r.json()["buildID"]
    assert api.get(f"/templates/{waiting}").json()["buildStatus"] == "waiting"
    assert api.delete(f"/templates/{waiting}").status_code == 204
    assert api.get(f"/templates/{waiting}/builds/{build}/status").status_code == 404
    assert api.get(f"/templates/{waiting}").status_code == 404
