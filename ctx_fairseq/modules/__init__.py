"""Reusable nn.Modules: each paper's equations live in one module here."""
