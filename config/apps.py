from django.contrib.admin.apps import AdminConfig


class JobopsAdminConfig(AdminConfig):
    # Every admin page sits behind password + OTP (django-otp's OTPAdminSite).
    default_site = "config.admin_site.JobopsAdminSite"
