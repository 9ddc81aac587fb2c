"""The catalog the planning tests read (its bundled entries, no local configs)."""
import pytest

from engine.models.planning.catalog import find_entry, load_catalog


@pytest.fixture(scope="module")
def entries():
    return load_catalog(local_configs=False)


def entry(entries, entry_id):
    found = find_entry(entry_id, entries)
    assert found is not None, entry_id
    return found
