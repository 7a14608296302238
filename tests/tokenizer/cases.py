"""The texts every tokenizer test runs on: hand-written edge cases, then each paragraph of
../shared/text/pride_and_prejudice.txt (paragraphs = text between blank lines, kept verbatim
with their inner newlines). Texts are bytes: some edge cases are deliberately invalid UTF-8."""

EDGE_CASES = [
    ("empty", b""),
    ("one_space", b" "),
    ("word", b"hello"),
    ("leading_space", b" hello"),
    ("leading_spaces", b"   hello world"),
    ("trailing_spaces", b"hello world   "),
    ("multiple_spaces", b"hello    world  again"),
    ("only_spaces", b"      "),
    ("newlines", b"line one\nline two\n\nline four\n"),
    ("only_newlines", b"\n\n\n"),
    ("crlf", b"windows\r\nline\r\n"),
    ("tabs", b"\tindented\twith\t\ttabs\t"),
    ("mixed_whitespace", b" \t \n  \r\n\t x"),
    ("digits", b"1 12 123 1234 12345 3.14159 2023-11-30 0x1F 1,000,000"),
    ("punctuation", b"Hello, world! (Really?) \"Yes\" -- it's... fine; ok: [a]{b}<c>"),
    ("contractions", b"I'm you're we've they'll she'd it's DON'T I'M"),
    ("emoji", "I \u2764\ufe0f \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467!".encode()),
    ("accents", "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe se\u00f1or \u00c5ngstr\u00f6m".encode()),
    ("combining", "e\u0301 a\u0308 n\u0303".encode()),
    ("cjk", "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4".encode()),
    ("cyrillic_greek_arabic", "\u041f\u0440\u0438\u0432\u0435\u0442 \u03ba\u03cc\u03c3\u03bc\u03b5 \u0645\u0631\u062d\u0628\u0627".encode()),
    ("symbols", "\u00a9 \u2122 \u20ac100 \u00bd \u2192 \u221e \u2260 \u00b0C".encode()),
    ("nbsp_and_unicode_spaces", "a\u00a0b\u2003c\u3000d".encode()),
    ("control_chars", b"a\x00b\x01c\x1fd\x7f"),
    ("special_token_text", b"<s>hello</s> <unk> <|endoftext|>"),
    ("byte_pieces_text", b"<0x41> <0xFF>"),
    ("long_word", b"Pneumonoultramicroscopicsilicovolcanoconiosis" * 3),
    ("long_run_of_spaces", b"a" + b" " * 100 + b"b"),
    ("invalid_lone_continuation", b"abc\x80def"),
    ("invalid_ff", b"\xff\xfe hello \xff"),
    ("invalid_truncated_sequence", b"cut \xe4\xb8 here"),
    ("invalid_overlong", b"overlong \xc0\xaf slash"),
    ("invalid_surrogate", b"surrogate \xed\xa0\x80 half"),
    ("invalid_at_end", b"ends with \xf0\x9f\x98"),
]


def paragraphs(text_bytes):
    return [p for p in text_bytes.replace(b"\r\n", b"\n").split(b"\n\n") if p.strip()]


def all_cases(shared_dir):
    """[(name, bytes)]: the edge cases, then the novel's paragraphs."""
    with open(f"{shared_dir}/text/pride_and_prejudice.txt", "rb") as f:
        novel = f.read()
    cases = list(EDGE_CASES)
    cases += [(f"pp_{i:04d}", p) for i, p in enumerate(paragraphs(novel))]
    return cases
