"""google_drive against a local fake of Drive v3 and Google's token endpoint: the real plugin code,
google-auth signing a real service-account JWT (checked by the fake), aiohttp for Drive. The folder
confinement holds for every operation, whatever id the model passes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes.drive_server import DriveFile, FakeDrive
from tests.fakes.openai_server import Reply
from tests.support.data_tools import call_tool, plugins_toml, service_account_file, status_of

FOLDER = "folderAAA111"
OTHER = "folderZZZ999"
ALLOW_WRITES = '[defaults]\nread = "allow"\nwrite = "allow"\n'
SA_EMAIL = "aiops-test@project.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def sa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def drive(sa_key: rsa.RSAPrivateKey) -> Iterator[FakeDrive]:
    with FakeDrive(public_key=sa_key.public_key(), refresh_token="1//refresh-test") as fake:
        yield fake


@pytest.fixture
def sa_file(tmp_path: Path, drive: FakeDrive, sa_key: rsa.RSAPrivateKey) -> Path:
    return service_account_file(tmp_path / "sa.json", sa_key, drive.token_uri, SA_EMAIL)


async def drive_engine(engine_factory, drive: FakeDrive, env: dict[str, str], gates: str = ALLOW_WRITES,
                       **settings: Any):
    files = {"plugins.toml": plugins_toml({"google_drive": {"base_url": drive.base_url, "folder_id": FOLDER,
                                                            **settings}})}
    if gates:
        files["gates.toml"] = gates
    engine = await engine_factory(extra_files=files, env=env)
    assert "google_drive" in engine.tools, engine.plugin_status
    return engine


@pytest.fixture
def files(drive: FakeDrive) -> dict[str, DriveFile]:
    return {
        "notes": drive.add_file("notes.txt", "line one\n", parents=[FOLDER], file_id="notesID1"),
        "doc": drive.add_file("Plan", "the plan", parents=[FOLDER], mime="application/vnd.google-apps.document",
                              file_id="docID1"),
        "secret": drive.add_file("secret.txt", "outside secret\n", parents=[OTHER], file_id="secretID1"),
    }


async def test_list_read_create_append_delete_in_the_folder(engine_factory, fake_openai, drive, sa_file, files):
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(sa_file)})
    assert status_of(engine, "google_drive") == ("started", f"folder {FOLDER} as service account {SA_EMAIL}")

    listed = await call_tool(engine, fake_openai, "google_drive", {"operation": "list"})
    assert "notes.txt  (id notesID1, 9 bytes" in listed.content and "Plan  (id docID1, Google document" in listed.content
    assert "secret" not in listed.content
    # google-auth signed the service account's JWT (the fake checked the signature) for Drive's scope.
    claims = drive.tokens.assertions[0]
    assert claims["iss"] == SA_EMAIL and claims["scope"] == "https://www.googleapis.com/auth/drive"

    read = await call_tool(engine, fake_openai, "google_drive", {"operation": "read", "file_name": "notes.txt"})
    assert "<<<untrusted content from Drive file notes.txt" in read.content and "line one" in read.content
    doc = await call_tool(engine, fake_openai, "google_drive", {"operation": "read", "file_id": "docID1"})
    assert "the plan" in doc.content  # a Google Doc is read through export
    assert any(h.path == "/drive/v3/files/docID1/export" and h.query["mimeType"] == "text/plain" for h in drive.hits)

    created = await call_tool(engine, fake_openai, "google_drive", {
        "operation": "create", "file_name": "incident.md", "content": "# Incident\n"})
    new = next(f for f in drive.files.values() if f.name == "incident.md")
    assert created.content == f"created 'incident.md' (id {new.id}, 11 characters)"
    assert new.parents == [FOLDER] and new.content == b"# Incident\n"
    again = await call_tool(engine, fake_openai, "google_drive", {
        "operation": "create", "file_name": "incident.md", "content": "dup"})
    assert again.meta["is_error"] and "already exists in the folder" in again.content

    appended = await call_tool(engine, fake_openai, "google_drive", {
        "operation": "append", "file_id": "notesID1", "content": "line two"})
    assert not appended.meta["is_error"], appended.content
    assert files["notes"].content == b"line one\nline two" and files["notes"].version == 2

    deleted = await call_tool(engine, fake_openai, "google_drive", {"operation": "delete", "file_id": new.id})
    assert "moved 'incident.md'" in deleted.content and "trash" in deleted.content
    assert new.id in drive.files and drive.files[new.id].trashed  # in the trash, not gone
    gone = await call_tool(engine, fake_openai, "google_drive", {"operation": "read", "file_id": new.id})
    assert gone.meta["is_error"] and "in the trash" in gone.content
    # One sign-in for all of it: the access token is reused until it expires.
    assert len(drive.tokens.assertions) == 1 and len(drive.tokens.issued) == 1


@pytest.mark.parametrize("operation", ["read", "append", "delete"])
async def test_a_file_outside_the_folder_is_refused_by_id(engine_factory, fake_openai, drive, sa_file, files,
                                                          operation):
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(sa_file)})
    msg = await call_tool(engine, fake_openai, "google_drive", {
        "operation": operation, "file_id": "secretID1", "content": "pwned"})
    assert msg.meta["is_error"]
    assert msg.content == (f"error: google_drive {operation}: refused: file secretID1 is not in the configured "
                           f"Drive folder; this tool works only on files in that folder")
    secret = files["secret"]
    assert secret.content == b"outside secret\n" and not secret.trashed and secret.version == 1
    assert "outside secret" not in msg.content
    # Only its metadata was looked at: never downloaded, never written.
    touched = [(h.method, h.path, h.query.get("alt")) for h in drive.hits if "secretID1" in h.path]
    assert touched == [("GET", "/drive/v3/files/secretID1", None)]


async def test_names_are_looked_up_in_the_folder_only_and_ids_must_be_ids(engine_factory, fake_openai, drive,
                                                                         sa_file, files):
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(sa_file)})
    by_name = await call_tool(engine, fake_openai, "google_drive", {"operation": "read", "file_name": "secret.txt"})
    assert by_name.content == "error: google_drive read: no file named 'secret.txt' in the Drive folder"
    hits = len(drive.hits)
    odd = await call_tool(engine, fake_openai, "google_drive", {"operation": "read",
                                                                "file_id": "../files/secretID1?alt=media"})
    assert odd.content == ("error: google_drive read: refused: '../files/secretID1?alt=media' is not a Drive "
                           "file id")
    assert len(drive.hits) == hits  # no request was made


async def test_an_append_refuses_when_the_file_changed_after_it_was_read(engine_factory, fake_openai, drive,
                                                                          sa_file, files):
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(sa_file)})

    def another_editor(f: DriveFile) -> None:
        drive.after_download = None
        f.content += b"their line\n"
        f.version += 1

    drive.after_download = another_editor
    msg = await call_tool(engine, fake_openai, "google_drive", {
        "operation": "append", "file_id": "notesID1", "content": "my line"})
    assert msg.meta["is_error"]
    assert msg.content == ("error: google_drive append: conflict: 'notes.txt' changed while appending (version 1 → 2); "
                           "nothing was written; read it again and retry")
    assert files["notes"].content == b"line one\ntheir line\n" and files["notes"].version == 2
    assert not any(h.method == "PATCH" for h in drive.hits)


async def test_two_appends_at_once_both_land(engine_factory, fake_openai, drive, sa_file, files):
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(sa_file)})
    fake_openai.script(Reply.tool_calls(
        ("google_drive", {"operation": "append", "file_id": "notesID1", "content": "from A\n"}),
        ("google_drive", {"operation": "append", "file_name": "notes.txt", "content": "from B\n"})),
        Reply.text("both"))
    await engine.run("api-par", "go", kind="api", timeout=30)
    results = [m for m in await engine.history("api-par") if m.role == "tool"]
    assert [m.meta["is_error"] for m in results] == [False, False], [m.content for m in results]
    content = files["notes"].content.decode()
    assert content.startswith("line one\n") and "from A\n" in content and "from B\n" in content
    assert files["notes"].version == 3


async def test_google_native_documents_are_not_appended_to(engine_factory, fake_openai, drive, sa_file, files):
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(sa_file)})
    msg = await call_tool(engine, fake_openai, "google_drive", {"operation": "append", "file_id": "docID1",
                                                                "content": "more"})
    assert msg.content == ("error: google_drive append: cannot append to 'Plan': it is a Google-native document, "
                           "whose content cannot be written back as text; create a new text file instead")
    assert files["doc"].content == b"the plan" and files["doc"].version == 1


async def test_an_oauth_token_file_works_without_a_browser(engine_factory, fake_openai, drive, files, tmp_path):
    token = tmp_path / "token.json"
    token.write_text(json.dumps({"type": "authorized_user", "client_id": "cid.apps.googleusercontent.com",
                                 "client_secret": "csecret", "refresh_token": "1//refresh-test",
                                 "token_uri": drive.token_uri}))
    engine = await drive_engine(engine_factory, drive, {"GOOGLE_DRIVE_TOKEN_FILE": str(token)})
    assert status_of(engine, "google_drive") == ("started", f"folder {FOLDER} as OAuth token file")
    listed = await call_tool(engine, fake_openai, "google_drive", {"operation": "list"})
    assert "notes.txt" in listed.content


async def test_credentials_that_are_missing_or_refused(engine_factory, fake_openai, drive, files, tmp_path):
    engine = await engine_factory(extra_files={"plugins.toml": plugins_toml({"google_drive": {
        "base_url": drive.base_url, "folder_id": FOLDER}})}, env={})
    assert status_of(engine, "google_drive") == (
        "skipped", "secret GOOGLE_APPLICATION_CREDENTIALS (a service-account JSON file) or GOOGLE_DRIVE_TOKEN_FILE "
                   "(an OAuth token file) is not set")
    gone = tmp_path / "nowhere.json"
    engine = await engine_factory(extra_files={"plugins.toml": plugins_toml({"google_drive": {
        "base_url": drive.base_url, "folder_id": FOLDER}})}, env={"GOOGLE_APPLICATION_CREDENTIALS": str(gone)})
    assert status_of(engine, "google_drive") == (
        "skipped", f"cannot read the Drive credentials file {gone}: FileNotFoundError")
    # A key the token endpoint does not accept: each call says so, the session goes on.
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"type": "service_account", "private_key": pem, "client_email": SA_EMAIL,
                                 "token_uri": drive.token_uri, "private_key_id": "k2"}))
    engine2 = await drive_engine(engine_factory, drive, {"GOOGLE_APPLICATION_CREDENTIALS": str(wrong)})
    msg = await call_tool(engine2, fake_openai, "google_drive", {"operation": "list"}, session="api-wrong")
    assert msg.meta["is_error"] and msg.content.startswith("error: google_drive list: Google sign-in failed:")
    assert "BEGIN PRIVATE KEY" not in msg.content and "csecret" not in msg.content
