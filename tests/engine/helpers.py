from engine.events import Failed, Finished, Tokens


def run_to_end(events):
    """Drain an engine generator; returns (Finished or Failed, list of Tokens events)."""
    tokens = []
    for event in events:
        if isinstance(event, Tokens):
            tokens.append(event)
        if isinstance(event, (Finished, Failed)):
            return event, tokens
    raise AssertionError("the engine stopped without Finished or Failed")
