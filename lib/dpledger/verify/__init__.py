"""dpledger.verify"""
