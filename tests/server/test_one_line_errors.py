from codecstream.server.errors import one_line


def test_an_error_is_its_messages_first_line():
    assert one_line(ValueError("\n  bad shape\nTraceback follows")) == "bad shape"


def test_an_error_without_a_message_is_its_type_name():
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(RuntimeError(), with_type=True) == "RuntimeError"


def test_with_type_names_the_type_before_the_message():
    assert one_line(OSError("disk full\nmore"), with_type=True) == "OSError: disk full"


def test_a_long_line_is_cut_at_the_limit_unless_the_limit_is_none():
    error = ValueError("x" * 300)
    assert one_line(error) == "x" * 200 + "…"
    assert one_line(error, limit=None) == "x" * 300
