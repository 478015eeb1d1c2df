"""String formats (``format``) as anchored regular expressions, turned into grammar rules by
regex_rules.py like any ``pattern`` (so minLength/maxLength are fitted the same way).

Each expression describes a subset of the format's valid strings (a canonical form: lowercase
hex in UUIDs and IPv6 addresses, uppercase ``T``/``Z`` in times, no user info in URIs...):
every string the grammar produces is valid for the format; some valid strings are not
produced. Where the subset is notably smaller than the format, the comment says so.
"""
from __future__ import annotations

_D = "[0-9]"
_YEAR = "(?:[1-9][0-9]{3}|0(?:[1-9][0-9]{2}|0(?:[1-9][0-9]|0[1-9])))"  # 0001-9999
_LEAP_YY = "(?:0[48]|[2468][048]|[13579][26])"
_LEAP_YEAR = f"(?:[0-9]{{2}}{_LEAP_YY}|{_LEAP_YY}00)"
_DATE = (f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         f"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)")
_HOUR = "(?:[01][0-9]|2[0-3])"
_TIME = f"{_HOUR}:[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{{1,9}})?(?:Z|[+-]{_HOUR}:[0-5][0-9])"  # RFC 3339, no leap second

_DEC_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = f"{_DEC_OCTET}(?:\\.{_DEC_OCTET}){{3}}"
_H16 = "[0-9a-f]{1,4}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join([  # RFC 3986 IPv6address
    f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}", f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}", f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}", f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}", f"(?:(?:{_H16}:){{0,6}}{_H16})?::"]) + ")"

# RFC 1123 labels; a hostname has at most 253 characters, which the grammar keeps by allowing
# at most 8 labels of at most 30 characters (a subset: longer labels are valid, not produced)
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?"
_HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,7}}"
# RFC 5321 Mailbox, dot-atom local part of at most 64 characters (at most one dot; quoted local
# parts and address literals are valid, not produced)
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = f"{_ATEXT}{{1,32}}(?:\\.{_ATEXT}{{1,31}})?@{_HOSTNAME}"

# RFC 3986: scheme in lowercase, percent-escapes in uppercase hex, no user info, host a
# hostname, an IPv4 address or an [IPv6 address]
_PCT = "%[0-9A-F]{2}"
_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_SEGMENT = f"{_PCHAR}*"
_SEGMENT_NZ = f"{_PCHAR}+"
_SEGMENT_NZ_NC = f"(?:[A-Za-z0-9._~!$&'()*+,;=@-]|{_PCT})+"
_AUTHORITY = f"(?:{_HOSTNAME}|{_IPV4}|\\[{_IPV6}\\])(?::[0-9]{{1,5}})?"
_QUERY = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|{_PCT})*"
_TAIL = f"(?:\\?{_QUERY})?(?:#{_QUERY})?"
_PATH_ABSOLUTE = f"/(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?"
_URI = f"[a-z][a-z0-9+.-]*:(?://{_AUTHORITY}(?:/{_SEGMENT})*|{_PATH_ABSOLUTE}|{_SEGMENT_NZ}(?:/{_SEGMENT})*)?{_TAIL}"
_RELATIVE_REF = f"(?://{_AUTHORITY}(?:/{_SEGMENT})*|{_PATH_ABSOLUTE}|{_SEGMENT_NZ_NC}(?:/{_SEGMENT})*)?{_TAIL}"

# RFC 3339 appendix A
_DUR_TIME = f"T(?:{_D}+H(?:{_D}+M(?:{_D}+S)?)?|{_D}+M(?:{_D}+S)?|{_D}+S)"
_DURATION = f"P(?:(?:{_D}+D|{_D}+M(?:{_D}+D)?|{_D}+Y(?:{_D}+M(?:{_D}+D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|{_D}+W)"

_JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"

#: format -> an anchored ECMA-262 expression of (a canonical subset of) its strings
FORMATS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "duration": f"^{_DURATION}$",
    "uuid": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "ipv4": f"^{_IPV4}$",
    "ipv6": f"^{_IPV6}$",
    "hostname": f"^{_HOSTNAME}$",
    "email": f"^{_EMAIL}$",
    "uri": f"^{_URI}$",
    "uri-reference": f"^(?:{_URI}|{_RELATIVE_REF})$",
    "json-pointer": f"^{_JSON_POINTER}$",
    # the number: no digit after a 0 (jsonschema's check refuses "105", though it is valid)
    "relative-json-pointer": f"^(?:0|[1-9]+0?)(?:#|{_JSON_POINTER})$",
    "regex": "^[A-Za-z0-9 _-]*$",  # literal text: a valid expression in every engine
}

#: formats whose strings include those of another: the other's subset is exact for them
#: ("url" is no JSON Schema format, but common in the wild for "uri")
ALIASES: dict[str, str] = {"iri": "uri", "iri-reference": "uri-reference", "idn-email": "email",
                           "idn-hostname": "hostname", "url": "uri"}

#: formats JSON Schema defines that no grammar here produces
UNENFORCEABLE: frozenset[str] = frozenset({"uri-template"})


def format_pattern(fmt: object) -> str | None:
    """The expression for a format, or None for a format that only annotates (one JSON Schema
    does not define, e.g. 'int32' or 'path')."""
    if not isinstance(fmt, str):
        return None
    return FORMATS.get(ALIASES.get(fmt, fmt))
