"""plain_acl.yml parsing and validation: every problem named with file, line, account and field."""

from __future__ import annotations

import textwrap

import pytest

from txmq.acl.config import AclConfigError, parse_acl_text
from txmq.acl.decision import compile_acl

GOOD = textwrap.dedent(
    """
    globalWhiteRemoteAddresses:
      - 10.10.103.*
      - 192.168.0.*
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678
        whiteRemoteAddress:
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms:
          - topicA=DENY
          - topicB=PUB|SUB
          - topicC=SUB
        groupPerms:
          - groupA=DENY
          - groupB=PUB|SUB
          - groupC=SUB
      - accessKey: 87654321
        secretKey: "12345678"
        whiteRemoteAddress: 192.168.1.*
        admin: true
    dataVersion:
      - timestamp: 1700000000000
        counter: 3
    """
)


def problems_of(text: str, path: str = "/etc/acl/plain_acl.yml") -> list[str]:
    with pytest.raises(AclConfigError) as info:
        parse_acl_text(textwrap.dedent(text), path)
    assert info.value.path == path
    return info.value.problems


def test_rocketmq_sample_file_loads_with_numbers_as_strings() -> None:
    f = parse_acl_text(GOOD, "plain_acl.yml")
    assert f.global_white_remote_addresses == ("10.10.103.*", "192.168.0.*")
    first, second = f.accounts
    assert first.access_key == "RocketMQ" and first.secret_key == "12345678"
    assert first.white_remote_address is None and first.admin is False
    assert first.topic_perms == (("topicA", "DENY"), ("topicB", "PUB|SUB"), ("topicC", "SUB"))
    assert first.group_perms[1] == ("groupB", "PUB|SUB")
    assert second.access_key == "87654321" and second.admin is True
    assert f.data_version == (1700000000000, 3)
    assert len(f.md5) == 32


def test_empty_file_is_an_empty_configuration() -> None:
    f = parse_acl_text("", "empty.yml")
    assert f.accounts == () and f.global_white_remote_addresses == ()
    assert parse_acl_text("# only a comment\n", "c.yml").accounts == ()


def test_yaml_syntax_error_names_file_and_line() -> None:
    [problem] = problems_of("accounts:\n  - accessKey: a\n    secretKey: [oops\n", "bad.yml")
    assert problem.startswith("bad.yml:") and "not valid YAML" in problem


def test_each_problem_names_file_line_account_and_field() -> None:
    problems = problems_of(
        """
        accounts:
          - accessKey: shortk
            secretKey: 1234567890
          - accessKey: goodAccessKey
            secretKey: abc
            defaultTopicPerm: pub
            topicPerms:
              - topicA=READ
              - topicB
            groupPerms: groupA=SUB
            whiteRemoteAddress: 10.1-2.3.4
            admin: maybe
            secretkey: typo
        """,
        "/conf/acl/team.yml",
    )
    text = "\n".join(problems)
    assert "/conf/acl/team.yml:3: accounts[0] (accessKey=shortk): field accessKey must be longer than 6" in text
    assert "/conf/acl/team.yml:6: accounts[1] (accessKey=goodAccessKey): field secretKey must be longer than 6" in text
    assert "field defaultTopicPerm: 'pub' is not one of DENY, PUB, SUB, PUB|SUB" in text
    assert ":9: accounts[1] (accessKey=goodAccessKey) field topicPerms: 'topicA=READ': permission 'READ'" in text
    assert ":10: accounts[1] (accessKey=goodAccessKey) field topicPerms: 'topicB' is not topic=PERM" in text
    assert "field groupPerms: must be a list" in text
    assert "field whiteRemoteAddress: '10.1-2.3.4'" in text
    assert "field admin must be true or false, not 'maybe'" in text
    assert "unknown field 'secretkey'" in text
    assert len(problems) == 9


def test_missing_keys_and_wrong_shapes() -> None:
    problems = problems_of(
        """
        globalWhiteRemoteAddresses: 10.0.0.1
        accounts:
          - secretKey: 1234567890
          - just a string
        acounts: []
        """
    )
    text = "\n".join(problems)
    assert "globalWhiteRemoteAddresses: must be a list" in text
    assert "accounts[0]: field accessKey is missing" in text
    assert "accounts[1]: each account must be a mapping" in text
    assert "unknown key 'acounts'" in text


def test_duplicate_access_key_in_one_file_is_an_error() -> None:
    problems = problems_of(
        """
        accounts:
          - {accessKey: sameKey1, secretKey: secret123}
          - {accessKey: sameKey1, secretKey: secret456}
        """
    )
    expected = "/etc/acl/plain_acl.yml:4: accounts[1] (accessKey=sameKey1): accessKey already defined by accounts[0]"
    assert problems == [expected]


def test_bad_global_whitelist_entry() -> None:
    [problem] = problems_of("globalWhiteRemoteAddresses:\n  - 10.0.0.1\n  - '*.1.2.3'\n")
    assert ":3: globalWhiteRemoteAddresses:" in problem and "first segment" in problem


def test_duplicate_access_key_across_files_first_loaded_wins() -> None:
    a = parse_acl_text("accounts:\n  - {accessKey: shared01, secretKey: first-secret}\n", "/conf/plain_acl.yml")
    b = parse_acl_text("accounts:\n  - {accessKey: shared01, secretKey: other-secret}\n", "/conf/acl/b.yml")
    state, warnings = compile_acl([a, b])
    assert state.accounts["shared01"].secret_key == "first-secret"
    assert state.accounts["shared01"].source == "/conf/plain_acl.yml"
    assert any("shared01 in /conf/acl/b.yml is ignored: /conf/plain_acl.yml defines it first" in w for w in warnings)


def test_whitelist_skip_is_announced_unless_strict() -> None:
    f = parse_acl_text(GOOD, "plain_acl.yml")
    _, warnings = compile_acl([f])
    assert any("87654321" in w and "skip the signature" in w and "aclStrictMode" in w for w in warnings)
    _, strict_warnings = compile_acl([f], strict=True)
    assert not any("skip the signature" in w for w in strict_warnings)
