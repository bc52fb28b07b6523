"""Lifecycle policies, one small pure module each; a module with a policy exposes ``rule(v: View)``, in
``lifecycle.POLICIES``'s order."""
