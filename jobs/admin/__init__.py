"""The jobs app's pages of the operator portal: the job list and a job's page
(jobs.admin.job_pages, its filters in jobs.admin.filters) and the schedules
(jobs.admin.schedules)."""

from __future__ import annotations

# Django's admin autodiscovery imports this package: importing the pages registers them.
from jobs.admin.job_pages import JobAdmin as JobAdmin
from jobs.admin.schedules import ScheduleAdmin as ScheduleAdmin
from jobs.admin.webhooks import WebhookEndpointAdmin as WebhookEndpointAdmin
