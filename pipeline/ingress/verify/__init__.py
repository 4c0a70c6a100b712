"""Request verification, one module per scheme, all behind :class:`Verifier`.

=====================  ==============================================  ==========================
scheme                 headers                                         module
=====================  ==============================================  ==========================
``meta``, ``github``   ``X-Hub-Signature-256: sha256=<hex>``            :mod:`.hub`
``stripe``             ``Stripe-Signature: t=..,v1=..``                 :mod:`.stripe`
``standard_webhooks``  ``webhook-id``/``-timestamp``/``-signature``     :mod:`.standard`
``hmac``               one configurable header                          :mod:`.hmac_header`
``none``               none (explicit opt-out)                          :mod:`.unverified`
=====================  ==============================================  ==========================
"""

from pipeline.ingress.verify.hmac_header import HmacHeaderVerifier
from pipeline.ingress.verify.hub import HubSignatureVerifier
from pipeline.ingress.verify.protocol import Verifier
from pipeline.ingress.verify.standard import StandardWebhooksVerifier
from pipeline.ingress.verify.stripe import StripeVerifier
from pipeline.ingress.verify.unverified import UnverifiedVerifier

__all__ = [
    "HmacHeaderVerifier",
    "HubSignatureVerifier",
    "StandardWebhooksVerifier",
    "StripeVerifier",
    "UnverifiedVerifier",
    "Verifier",
]
