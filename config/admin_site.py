from django_otp.admin import OTPAdminSite


class JobopsAdminSite(OTPAdminSite):
    site_header = "jobops operations"
    site_title = "jobops"
    index_title = "Operations"
