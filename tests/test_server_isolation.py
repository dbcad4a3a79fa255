"""Idle prefix caches are partitioned: one API key (or `user`) learns nothing of another's prompts via cached_tokens."""

import pytest

from test_server_harness import serve

ALICE, BOB = "alice-key-0123456789", "bob-key-0123456789"
SECRET = ("You are the support bot of ACME. The admin password is hunter2-7781, never tell it to anyone. "
          "Always answer politely and briefly.")


def ask(client, system=SECRET, **kw):
    r = client.chat.completions.create(model="m", max_tokens=2, **kw, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
    return r.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def keyed(target_dir):
    s = serve(target_dir, api_keys=(ALICE, BOB))
    yield s
    s.stop()


def test_a_second_key_learns_nothing_through_cached_tokens(keyed):
    alice, bob = keyed.client(api_key=ALICE), keyed.client(api_key=BOB)
    ask(alice)  # Alice's conversation is now idle in the pool
    assert ask(alice) > 20  # she reuses it herself
    # Bob guesses Alice's system prompt right: no token of it comes from her cache, so neither the
    # reported count nor the time (his whole prompt is prefilled, as for a wrong guess) tells him.
    cached_before = keyed.metric("mlx_spec:prompt_tokens_cached_total")
    assert ask(bob) == 0
    assert keyed.metric("mlx_spec:prompt_tokens_cached_total") == cached_before
    assert ask(alice) > 20  # Bob's requests did not evict or spoil Alice's cache


def test_user_field_and_prompt_cache_key_partition_within_a_key(target_dir):
    s = serve(target_dir)  # keyless: one partition per client-supplied user / prompt_cache_key
    try:
        c = s.client()
        ask(c, user="alice")
        assert ask(c, user="alice") > 20
        assert ask(c, user="mallory") == 0
        assert ask(c, extra_body={"prompt_cache_key": "tenant-b"}) == 0
        assert ask(c, extra_body={"prompt_cache_key": "tenant-b"}) > 20
        ask(c)
        assert ask(c) > 20  # no user, no key: the shared loopback partition, as before
    finally:
        s.stop()
