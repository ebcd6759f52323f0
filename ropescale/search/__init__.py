"""ropescale.search"""
