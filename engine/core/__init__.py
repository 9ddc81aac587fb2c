"""Foundations every other part uses: where files live, what a request asks for, the events a run yields, token sampling."""
