"""How the portal writes a date and time wherever Django formats one for it (the admin's
lists and read-only fields, `{{ value|date:"DATETIME_FORMAT" }}`): to the second, with
its zone. An operator comparing the portal with a log line needs both; "Nov. 29, 2026,
8:09 a.m." has neither. Templates of the portal use the `when` filter
(core/templatetags/jobops_portal.py), which writes the same text."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
TIME_FORMAT = "H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
