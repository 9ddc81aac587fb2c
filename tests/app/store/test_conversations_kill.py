"""kill -9 during conversation saves: a subprocess saves in a loop and is killed at random
moments, 20 times. Afterwards every conversation file is the old or the new complete version
(none lost, none torn), and the start-up clean-up removes the temporaries the kills left."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.store.conversations import STALE_TEMPORARY_S, Conversation, ConversationStore
from tests.paths import REPO_ROOT as ROOT

IDS = ("alpha1", "beta22", "gamma3")
KILLS = 20


def messages(cid: str, version: int) -> list[dict]:
    """Version ``version`` of conversation ``cid``: a few hundred KB, so a kill often lands mid-write."""
    return [{"role": "user", "content": f"{cid} v{version} " + "q" * 150_000},
            {"role": "assistant", "content": f"{cid} v{version} " + "a" * 150_000, "stats": f"v{version}"}]


def _version_of(conversation_messages) -> int:
    return int(conversation_messages[0]["content"].split()[1][1:])


def save_forever(directory: str, ids: str) -> None:
    """The child: save each conversation's next version, round and round, reporting each save."""
    store = ConversationStore(Path(directory))
    versions = {c.id: _version_of(c.messages) for c in store.load_all()}
    conversations = [Conversation(id=cid, title=cid) for cid in ids.split(",")]
    print("ready", flush=True)
    while True:
        for c in conversations:
            versions[c.id] = versions.get(c.id, 0) + 1
            c.messages = messages(c.id, versions[c.id])
            store.save(c)
            print(c.id, versions[c.id], flush=True)


SAVER = "import sys; from tests.app.store.test_conversations_kill import save_forever; save_forever(*sys.argv[1:])"


def _version_on_disk(store, cid):
    raw = json.loads(store.path(cid).read_text(encoding="utf-8"))  # a torn file raises here
    version = _version_of(raw["messages"])
    assert raw["messages"] == messages(cid, version), f"{cid}: v{version} is not complete"
    return version


def test_kill_9_during_saves_never_loses_or_tears_a_conversation(tmp_path):
    directory = tmp_path / "conversations"
    ConversationStore(directory)
    committed = {cid: 0 for cid in IDS}  # the newest version known to be on disk
    rng = random.Random(1234)
    handled = mid_save = 0
    for _ in range(KILLS):
        # Unbuffered: readline() then takes "ready" byte by byte and leaves the save reports in
        # the pipe. A buffered reader could swallow the first reports (and half a line) with it,
        # where communicate(), which reads the pipe itself, never sees them.
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(directory), ",".join(IDS)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        assert child.stdout.readline().strip() == b"ready", child.stderr.read()
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGKILL
        reported = dict(committed)
        # Complete lines only: a kill may land between a report's text and its newline.
        for line in out.decode().split("\n")[:-1]:
            cid, version = line.split()
            reported[cid] = int(version)
        temporaries = list(directory.glob(".tmp-*.json"))
        mid_save += bool(temporaries)
        store = ConversationStore(directory)
        for cid in IDS:
            if reported[cid] == 0 and not store.path(cid).exists():
                continue  # killed before its first save finished: nothing was ever committed
            on_disk = _version_on_disk(store, cid)
            # the last save it reported, or the one in flight (renamed into place, not yet reported)
            assert on_disk in (reported[cid], reported[cid] + 1), (cid, on_disk, reported[cid])
            assert on_disk >= committed[cid], f"{cid} went back from v{committed[cid]} to v{on_disk}"
            committed[cid] = on_disk
        loaded = store.load_all()  # a start right after the kill: fresh temporaries are left alone
        assert store.set_aside == () and {c.id for c in loaded} <= set(IDS)
        assert set(directory.glob(".tmp-*.json")) == set(temporaries)
        handled += 1

    # A later start: the temporaries are stale now, and they go.
    old = time.time() - STALE_TEMPORARY_S - 60
    for tmp in directory.glob(".tmp-*.json"):
        os.utime(tmp, (old, old))
    store = ConversationStore(directory)
    loaded = store.load_all()
    assert not list(directory.glob(".tmp-*")), "stale temporaries were not cleaned at start"
    assert store.set_aside == ()
    assert {c.id for c in loaded} == {cid for cid, v in committed.items() if v > 0}
    lost = sum(_version_on_disk(store, cid) != committed[cid] for cid in IDS if committed[cid])
    print(f"\nkill -9 during saves: tried {KILLS}, handled {handled}, killed mid-save {mid_save}, "
          f"data lost {lost}, final versions {committed}")
    assert handled == KILLS and lost == 0
